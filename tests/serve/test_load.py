"""A bounded load test (slow tier): 64 requests from 16 concurrent clients, streamed and not, in at
most 60 s: every answer complete and equal to the same prompt's answer alone, none lost or
duplicated, the server healthy after and its metrics counting them all."""

from __future__ import annotations

import concurrent.futures
import random
import time

import httpx
import pytest

from .conftest import MODEL

pytestmark = pytest.mark.slow
SERVER_FLAGS = ("--max_waiting=64",)
PROMPTS = [[4 + (7 * i + j) % 60 for j in range(1 + i % 13)] for i in range(16)]


def test_64_requests_from_16_clients(server):
    client = server.client(max_retries=0, timeout=60)
    alone = {i: client.completions.create(model=MODEL, prompt=p).model_dump()["choices"][0]
             for i, p in enumerate(PROMPTS)}
    jobs = [(k, k % len(PROMPTS), k % 2 == 0) for k in range(64)]
    random.Random(64).shuffle(jobs)

    def ask(job):
        k, i, stream = job
        if stream:
            chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[i], stream=True,
                                                    user=str(k)))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            last = chunks[-1].model_dump()["choices"][0]
            return k, i, text, last["alodlm"]["token_ids"], last["finish_reason"]
        answer = client.completions.create(model=MODEL, prompt=PROMPTS[i], user=str(k))
        choice = answer.model_dump()["choices"][0]
        return k, i, choice["text"], choice["alodlm"]["token_ids"], choice["finish_reason"]

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(ask, jobs))
    elapsed = time.monotonic() - t0
    assert elapsed < 60, elapsed
    assert sorted(k for k, *_ in results) == list(range(64))  # none lost, none twice
    for k, i, text, ids, finish in results:
        assert ids == alone[i]["alodlm"]["token_ids"], k
        assert text == alone[i]["text"] and finish == alone[i]["finish_reason"]
    assert httpx.get(server.base_url + "/health").json() == {"status": "ok"}
    metrics = httpx.get(server.base_url + "/metrics").text
    assert 'alodlm_requests_total{endpoint="/v1/completions",status="200"} 80.0' in metrics
    assert "alodlm_requests_running 0.0" in metrics
