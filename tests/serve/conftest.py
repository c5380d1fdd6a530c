"""The serve tests' server: ``alodlm-jax-serve`` in a fresh interpreter on 127.0.0.1 (a free
port), on builtin:tiny, waited for until ``/health`` answers; one per test module."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from alodlm_jax.data import BUILTINS  # noqa: E402

TINY = str(BUILTINS["builtin:tiny"])
MODEL = "tiny_checkpoint"  # the served name of builtin:tiny
# The decoding settings and shapes of every server here (builtin:tiny has 128 positions): one set
# of programs, compiled by the first server and read from the compilation cache (the suite's
# XDG_CACHE_HOME) by the others.
DECODE = dict(window_size=4, max_new_tokens=96, q=0.5, tau=0.4)
SHAPES = ("--batch_size=2", "--max_prompt_tokens=32")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class Served:
    process: subprocess.Popen
    port: int
    log: str

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kwargs):
        import openai

        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=kwargs.pop("api_key", "none"),
                             **kwargs)

    def output(self) -> str:
        with open(self.log) as f:
            return f.read()


def start(tmp_path, *extra: str, decode=DECODE, env=None, timeout: float = 600) -> Served:
    import httpx

    port = free_port()
    log = str(tmp_path / f"serve-{port}.log")
    args = [sys.executable, "-c", "from alodlm_jax.cli.serve import run; run()", "--model", TINY,
            "--port", str(port), *(f"--{k}={v}" for k, v in decode.items()), *SHAPES, *extra]
    with open(log, "w") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, **(env or {})})
    served = Served(process, port, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited {process.returncode}:\n{served.output()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(served.base_url + "/health", timeout=2).status_code == 200:
                return served
        time.sleep(0.25)
    stop(served)
    raise AssertionError(f"the server was not ready in {timeout} s:\n{served.output()}")


def stop(served: Served) -> int:
    if served.process.poll() is None:
        served.process.send_signal(signal.SIGTERM)
        try:
            served.process.wait(60)
        except subprocess.TimeoutExpired:
            served.process.kill()
            served.process.wait()
    return served.process.returncode


@pytest.fixture(scope="module")
def server(tmp_path_factory, request):
    extra = getattr(request.module, "SERVER_FLAGS", ())
    served = start(tmp_path_factory.mktemp("serve"), *extra)
    yield served
    stop(served)
