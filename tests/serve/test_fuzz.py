"""A property-based fuzz of the server's OpenAPI schema (schemathesis, slow tier): whatever the
bodies, no request gets a 5xx and the server stays healthy."""

from __future__ import annotations

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture
def api_schema(server):
    return schemathesis.openapi.from_url(server.base_url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=40, deadline=None,
          suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_5xx(case, server):
    response = case.call(timeout=120)
    assert response.status_code < 500, (case.path, case.body, response.text[:500])
    if response.status_code >= 400:
        assert "error" in response.json()
    assert httpx.get(server.base_url + "/health").status_code == 200
