"""A server's life: the API key, a full queue (429 with Retry-After), a client that disconnects
mid-stream (its slot frees: the engine stops decoding it), SIGTERM (running streams finish, exit
0). One slot, a budget of one step per execution and long answers, so that requests overlap."""

from __future__ import annotations

import signal
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import MODEL, start, stop

KEY = "sesame"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Return value one"}],
        "stream": True}
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    served = start(tmp_path_factory.mktemp("serve"), "--max_waiting=0", "--step_budget=1",
                   env={"ALODLM_JAX_API_KEY": KEY})
    yield served
    stop(served)


def metric(server, name: str) -> float:
    text = httpx.get(server.base_url + "/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise KeyError(name)


def idle(server, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metric(server, "alodlm_requests_running") == 0 and \
                metric(server, "alodlm_requests_waiting") == 0:
            return
        time.sleep(0.05)
    raise AssertionError("the server did not go idle")


def test_the_api_key(server):
    url = server.base_url + "/v1/models"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).json()["error"]["code"] == \
        "invalid_api_key"
    assert httpx.get(url, headers=AUTH).status_code == 200
    assert httpx.get(server.base_url + "/health").status_code == 200  # no key needed
    assert server.client(api_key=KEY).models.list().data[0].id == MODEL


def test_a_full_queue_answers_429_with_retry_after(server):
    url = server.base_url + "/v1/chat/completions"
    with httpx.Client(headers=AUTH, timeout=60) as client:
        with client.stream("POST", url, json=CHAT) as one, \
                client.stream("POST", url, json=CHAT) as two:
            for response in (one, two):  # the role chunk: both are submitted (two slots)
                assert response.status_code == 200
                next(response.iter_lines())
            refused = client.post(url, json=CHAT)
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == "queue_full"
    idle(server)
    assert client_answer(server)["finish_reason"] in ("stop", "length")


def client_answer(server) -> dict:
    response = httpx.post(server.base_url + "/v1/completions", headers=AUTH, timeout=120,
                          json={"model": MODEL, "prompt": "hello world"})
    assert response.status_code == 200
    return response.json()["choices"][0]


def test_a_client_that_disconnects_mid_stream_frees_its_slot(server):
    whole = client_answer(server)
    tokens = len(whole["alodlm"]["token_ids"])
    assert tokens > 40  # a long answer: many executions of one step each
    before = metric(server, "alodlm_generated_tokens_total")
    body = {"model": MODEL, "prompt": "hello world", "stream": True}
    with httpx.Client(headers=AUTH, timeout=60) as client:
        with client.stream("POST", server.base_url + "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
    idle(server)
    decoded = metric(server, "alodlm_generated_tokens_total") - before
    assert 0 < decoded < tokens  # the engine stopped decoding it when the client left
    assert client_answer(server)["alodlm"]["token_ids"] == whole["alodlm"]["token_ids"]


def test_sigterm_finishes_running_streams_and_exits_0(server):
    whole = client_answer(server)
    body = {"model": MODEL, "prompt": "hello world", "stream": True}
    text, done = [], False
    with httpx.Client(headers=AUTH, timeout=60) as client:
        with client.stream("POST", server.base_url + "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("data:"))
            server.process.send_signal(signal.SIGTERM)
            import json

            for line in [first, *lines]:
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    done = True
                    break
                text.append(json.loads(data)["choices"][0]["text"])
    assert done
    assert "".join(text) == whole["text"]
    assert server.process.wait(60) == 0
