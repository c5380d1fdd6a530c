"""``alodlm-jax-serve``: an OpenAI-compatible HTTP server on the compiled engine's batch program.

* :mod:`.schemas` — the request bodies (pydantic models) and OpenAI-style error bodies;
* :mod:`.engine` — the engine loop: one thread owns the batch program, admits requests into free
  slots and runs the program with a step budget, reporting each request's committed tokens;
* :mod:`.output` — a request's committed tokens as text: deltas for streaming, stop strings and
  stop ids, the per-choice ALoDLM result;
* :mod:`.metrics` — the Prometheus metrics (``prometheus_client``);
* :mod:`.app` — the FastAPI application (endpoints, authentication, errors, SSE streaming).

The command is :mod:`alodlm_jax.cli.serve`; ``docs/serve.md`` describes the API.
"""
