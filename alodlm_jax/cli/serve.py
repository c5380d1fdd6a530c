"""Serve a model over OpenAI's HTTP API (completions, chat completions, models), with health and
Prometheus metrics, on the compiled engine's batch program with continuous batching.

The server loads the model and compiles its programs before it listens (--host, --port; loopback
by default). Requests decode in --batch_size slots: a request that arrives while a slot is free
starts within --step_budget steps, and streaming sends each execution's committed text. Every
response's token ids equal alodlm-jax-generate's for the same prompt and settings. The decoding
settings (--mode, --window_size, --q, --tau, --position_penalty, --max_new_tokens) are the
server's. SIGTERM stops accepting, finishes the running requests (at most --drain_seconds) and
exits 0. docs/serve.md describes the API.
"""

from __future__ import annotations

import os
import pathlib
import signal
import sys
from typing import Sequence

from absl import flags

from alodlm_jax.cli.flags import (FlagError, decode_config_from_flags, define_decode_flags,
                                  define_generator_flags, generator_from_flags, run_command)

PROG = "alodlm-jax-serve"
API_KEY_ENV = "ALODLM_JAX_API_KEY"
FLAGS = flags.FlagValues()

define_generator_flags(FLAGS, model_note="Required.")
define_decode_flags(FLAGS)
flags.DEFINE_string("host", "127.0.0.1", "Address to listen on (loopback by default; 0.0.0.0 "
                    "for every interface).", flag_values=FLAGS)
flags.DEFINE_integer("port", 8000, "Port to listen on.", lower_bound=1, upper_bound=65535,
                     flag_values=FLAGS)
flags.DEFINE_string("api_key", None, "Require `Authorization: Bearer <key>` on /v1/* "
                    f"(default: ${API_KEY_ENV}; neither: no authentication).", flag_values=FLAGS)
flags.DEFINE_string("served_model_name", None, "The model's name in the API (the requests' "
                    "`model`). Default: the model directory's name, or the Hub id.",
                    flag_values=FLAGS)
flags.DEFINE_integer("max_prompt_tokens", None, "Longest prompt in tokens (it fixes the batch "
                     "program's prompt bucket). Default: 1024, or less where the model's context "
                     "minus --max_new_tokens is less.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("step_budget", None, "Most steps (one recurrent pass of every running "
                     "request) of one batch program execution before the server admits arrivals "
                     "and streams committed text. Default: the model's maximum depth (the most "
                     "passes of one window).", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("max_waiting", 64, "Most requests waiting for a slot while every slot is "
                     "taken; beyond, 429 with Retry-After.", lower_bound=0, flag_values=FLAGS)
flags.DEFINE_float("drain_seconds", 30.0, "On SIGTERM, the most seconds spent finishing the "
                   "requests that are running.", lower_bound=0.0, flag_values=FLAGS)
flags.DEFINE_enum("log_level", "warning", ["critical", "error", "warning", "info", "debug"],
                  "uvicorn's log level.", flag_values=FLAGS)


def model_name(model: str) -> str:
    path = pathlib.Path(model)
    return path.name if path.exists() else model


def _serve() -> int:
    import uvicorn

    if FLAGS.batch_size == "auto" or not isinstance(FLAGS.batch_size, int):
        raise FlagError("batch_size", "give a number of slots (auto is evaluate's)")
    if FLAGS.engine != "compiled":
        raise FlagError("engine", "the server runs the compiled engine's batch program")
    decode = decode_config_from_flags(FLAGS)
    api_key = FLAGS.api_key if FLAGS.api_key is not None else os.environ.get(API_KEY_ENV) or None
    generator, _, device = generator_from_flags(FLAGS, decode)
    cfg = generator.cfg
    room = cfg.max_position_embeddings - decode.max_new_tokens
    if room < 1:
        raise FlagError("max_new_tokens", f"{decode.max_new_tokens} leaves no room for a prompt "
                        f"in the model's {cfg.max_position_embeddings} positions")
    max_prompt = FLAGS.max_prompt_tokens or min(1024, room)
    if max_prompt > room:
        raise FlagError("max_prompt_tokens", f"{max_prompt} plus --max_new_tokens "
                        f"{decode.max_new_tokens} exceeds the model's {cfg.max_position_embeddings} "
                        "positions")

    from alodlm_jax.serve.app import Server, create_app
    from alodlm_jax.serve.engine import EngineLoop
    from alodlm_jax.serve.metrics import Metrics

    metrics = Metrics()
    print(f"{PROG}: compiling the batch programs ({FLAGS.batch_size} slot(s), prompts up to "
          f"{max_prompt} tokens) on {device}", file=sys.stderr, flush=True)
    loop = EngineLoop(generator.engine, batch_size=FLAGS.batch_size, max_prompt_tokens=max_prompt,
                      step_budget=FLAGS.step_budget or cfg.max_depth,
                      max_waiting=FLAGS.max_waiting, on_change=metrics.slots,
                      on_finished=metrics.finished)
    loop.start()
    server = Server(generator=generator, loop=loop, model_name=FLAGS.served_model_name
                    or model_name(FLAGS.model), max_prompt_tokens=max_prompt, api_key=api_key,
                    drain_seconds=FLAGS.drain_seconds, metrics=metrics)
    ready = (f"{PROG}: ready: http://{FLAGS.host}:{FLAGS.port}/v1 serving "
             f"{server.model_name!r}")
    app = create_app(server, on_ready=lambda: print(ready, file=sys.stderr, flush=True))
    config = uvicorn.Config(app, host=FLAGS.host, port=FLAGS.port, log_level=FLAGS.log_level,
                            timeout_graceful_shutdown=FLAGS.drain_seconds, lifespan="on")
    # uvicorn raises the signal again once it has shut down; a handler of ours takes it, so that a
    # drained server exits 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    uvicorn.Server(config).run()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command with ``argv`` (``sys.argv`` by default); returns the exit status."""
    return run_command(_serve, prog=PROG, description=__doc__, flag_values=FLAGS, argv=argv,
                       required=("model",))


def run() -> None:
    """Console entry point ``alodlm-jax-serve``."""
    sys.exit(main())


if __name__ == "__main__":
    run()
