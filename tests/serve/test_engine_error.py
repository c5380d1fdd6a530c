"""An engine error fails the requests in the batch with 500 (an OpenAI error body) and the
server goes on: the next request decodes the generator's tokens. In this process, with the batch
program made to raise once. The shapes are test_api's server's, and the compilation cache the
servers write (the suite's XDG_CACHE_HOME) is read, so that little compiles again."""

from __future__ import annotations


from .conftest import DECODE, MODEL, TINY


def test_an_engine_error_fails_its_requests_and_the_server_goes_on():
    from fastapi.testclient import TestClient

    from alodlm_jax.cli.flags import default_compilation_cache_dir
    from alodlm_jax.config import DecodeConfig
    from alodlm_jax.generate import build_generator
    from alodlm_jax.serve.app import Server, create_app
    from alodlm_jax.serve.engine import EngineLoop

    generator = build_generator(model=TINY, decode_config=DecodeConfig(**DECODE),
                                engine="compiled",
                                compilation_cache_dir=str(default_compilation_cache_dir()))
    loop = EngineLoop(generator.engine, batch_size=2, max_prompt_tokens=32,
                      step_budget=generator.cfg.max_depth, max_waiting=4)
    real, calls = loop._run, []

    def failing_once(*args):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected device fault")
        return real(*args)

    loop._run = failing_once
    loop.start()
    app = create_app(Server(generator=generator, loop=loop, model_name=MODEL,
                            max_prompt_tokens=32))
    body = {"model": MODEL, "prompt": "hello world"}
    with TestClient(app) as client:
        failed = client.post("/v1/completions", json=body)
        assert failed.status_code == 500
        assert failed.json()["error"]["code"] == "engine_error"
        assert "injected device fault" in failed.json()["error"]["message"]
        ok = client.post("/v1/completions", json=body)
        assert ok.status_code == 200
        want = generator.generate_ids(generator.encode_verbatim("hello world"))
        assert ok.json()["choices"][0]["alodlm"]["token_ids"] == want["token_ids"]
        streamed = client.post("/v1/completions", json={**body, "stream": True})
        assert streamed.status_code == 200 and "[DONE]" in streamed.text
        assert client.get("/health").status_code == 200
    assert not loop.alive  # the app's shutdown drained and stopped the loop
