"""The server's API through the official openai client: completions and chat, streamed and not,
equal to the generator's tokens (what alodlm-jax-generate prints) whatever the arrival order;
stop strings and stop ids; every refusal an OpenAI-style error body, never a 500."""

from __future__ import annotations

import concurrent.futures
import random

import httpx
import openai
import pytest

from .conftest import DECODE, MODEL, TINY

SERVER_FLAGS = ("--max_waiting=16",)

TEXTS = ["hello world", "Return value one", "a b c d e f g h i j k l", "x",
         "the quick brown fox jumps", "t3 t4 t5"]
IDS = [[5, 6, 7, 8, 9, 10, 11], [9, 9, 9], list(range(13, 29)), [7]]


@pytest.fixture(scope="module")
def reference(server):  # after the server started: this process loads JAX only now
    from alodlm_jax.cli.flags import default_compilation_cache_dir
    from alodlm_jax.config import DecodeConfig
    from alodlm_jax.generate import build_generator

    return build_generator(model=TINY, decode_config=DecodeConfig(**DECODE), engine="compiled",
                           compilation_cache_dir=str(default_compilation_cache_dir()))


def extra(response) -> dict:
    return response.model_dump()["choices"][0]["alodlm"]


def test_completions_equal_the_generator_whatever_the_arrival_order(server, reference):
    client = server.client()
    prompts = [*TEXTS, *IDS]
    order = list(range(len(prompts)))
    random.Random(49).shuffle(order)
    delays = {i: random.Random(i).uniform(0, 0.4) for i in order}

    def ask(i):
        import time

        time.sleep(delays[i])
        return i, client.completions.create(model=MODEL, prompt=prompts[i])

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        answers = dict(pool.map(ask, order))
    for i, prompt in enumerate(prompts):
        ids = reference.encode_verbatim(prompt) if isinstance(prompt, str) else prompt
        want = reference.generate_ids(ids)
        got = answers[i]
        assert extra(got)["token_ids"] == want["token_ids"], prompt
        assert extra(got)["exit_depths"] == want["exit_depths"]
        assert extra(got)["recurrent_passes"] == want["recurrent_passes"]
        assert extra(got)["outer_steps"] == want["outer_steps"]
        assert got.choices[0].text == want["text"]
        assert got.choices[0].finish_reason == {"eos": "stop", "length": "length"}[
            want["stop_reason"]]
        assert got.usage.prompt_tokens == len(ids)
        assert got.usage.completion_tokens == len(want["token_ids"])


def test_streams_equal_the_whole_answers_and_chat_uses_the_template(server, reference):
    client = server.client()
    whole = client.completions.create(model=MODEL, prompt=TEXTS[2])
    chunks = list(client.completions.create(model=MODEL, prompt=TEXTS[2], stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == \
        whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert len([c for c in chunks if c.choices]) > 2  # text arrives as it commits

    want = reference.generate_ids(reference.chat_prompt_ids("Return value one"))
    messages = [{"role": "user", "content": "Return value one"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages)
    assert extra(chat)["token_ids"] == want["token_ids"]
    assert chat.choices[0].message.content == want["text"]
    assert chat.choices[0].message.role == "assistant"
    streamed = list(client.chat.completions.create(model=MODEL, messages=messages, stream=True))
    assert streamed[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == want["text"]
    assert streamed[-1].model_dump()["choices"][0]["alodlm"]["token_ids"] == want["token_ids"]
    assert streamed[-1].usage is None  # no include_usage: no usage chunk


def test_stop_strings_and_stop_ids_cut_the_decoder_tokens(server):
    client = server.client()
    whole = client.completions.create(model=MODEL, prompt=IDS[0])
    ids, text = extra(whole)["token_ids"], whole.choices[0].text
    words = text.split(" ")
    stop = " " + words[3]
    cut = client.completions.create(model=MODEL, prompt=IDS[0], stop=[stop, "never seen"])
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    assert extra(cut)["stop_reason"] == "stop_string"
    assert ids[: len(extra(cut)["token_ids"])] == extra(cut)["token_ids"]  # a prefix
    streamed = list(client.completions.create(model=MODEL, prompt=IDS[0], stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == cut.choices[0].text

    stop_id = ids[5]
    by_id = client.completions.create(model=MODEL, prompt=IDS[0],
                                      extra_body={"stop_token_ids": [stop_id]})
    assert extra(by_id)["token_ids"] == ids[: ids.index(stop_id)]
    assert by_id.choices[0].finish_reason == "stop"
    assert extra(by_id)["stop_reason"] == "stop_id"


def test_models_health_and_metrics(server):
    client = server.client()
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert httpx.get(server.base_url + "/health").json() == {"status": "ok"}
    text = httpx.get(server.base_url + "/metrics").text
    for name in ("alodlm_requests_total", "alodlm_requests_waiting", "alodlm_requests_running",
                 "alodlm_generated_tokens_total", "alodlm_time_to_first_token_seconds_bucket",
                 "alodlm_request_latency_seconds_bucket",
                 "alodlm_recurrent_passes_per_token_bucket"):
        assert name in text, name


BAD = [
    # (body or raw text, status, words in the message)
    ('{"model": "tiny_checkpoint", "prompt": ', 400, "not valid JSON"),
    ({"model": MODEL, "prompt": 5}, 422, "prompt"),
    ({"model": MODEL}, 422, "prompt"),
    ({"model": MODEL, "prompt": "x", "max_tokens": "ten"}, 422, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "stream": "yes"}, 422, "stream"),
    ({"model": "gpt-4", "prompt": "x"}, 404, "gpt-4"),
    ({"model": MODEL, "prompt": "word " * 60}, 400, "max_prompt_tokens"),
    ({"model": MODEL, "prompt": [99, 1]}, 400, "[0, 64)"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 97}, 400, "budget 96"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 5}, 400, "the server's 96"),
    ({"model": MODEL, "prompt": "x", "n": 2}, 400, "n must be 1"),
    ({"model": MODEL, "prompt": "x", "logprobs": 1}, 400, "logprobs"),
    ({"model": MODEL, "prompt": "x", "temperature": 0.7}, 400, "greedy"),
    ({"model": MODEL, "prompt": "x", "mode": "left1"}, 400, "mode=entropy"),
    ({"model": MODEL, "prompt": "x", "window_size": 8}, 400, "window_size=4"),
    ({"model": MODEL, "prompt": ["a", "b"]}, 400, "one prompt"),
]


@pytest.mark.parametrize("body, status, words", BAD)
def test_bad_requests_get_openai_error_bodies(server, body, status, words):
    url = server.base_url + "/v1/completions"
    response = (httpx.post(url, content=body, headers={"content-type": "application/json"})
                if isinstance(body, str) else httpx.post(url, json=body))
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert words in error["message"]
    assert set(error) == {"message", "type", "param", "code"}


def test_chat_refusals_and_unknown_routes(server):
    base = server.base_url
    chat = base + "/v1/chat/completions"
    assert httpx.post(chat, json={"model": MODEL, "messages": []}).status_code == 422
    assert httpx.post(chat, json={"model": MODEL, "messages": [{"role": "x", "content": "y"}]}
                      ).status_code == 422
    response = httpx.post(chat, json={"model": MODEL, "logprobs": True,
                                      "messages": [{"role": "user", "content": "y"}]})
    assert response.status_code == 400 and "logprobs" in response.json()["error"]["message"]
    assert httpx.get(base + "/v1/nothing").status_code == 404
    assert "error" in httpx.get(base + "/v1/nothing").json()
    assert httpx.get(base + "/v1/completions").status_code == 405
    with pytest.raises(openai.NotFoundError):
        server.client().chat.completions.create(model="other", messages=[
            {"role": "user", "content": "y"}])
    assert httpx.get(base + "/health").status_code == 200  # alive after all of it
