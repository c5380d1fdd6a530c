"""Adaptive decoding (MODEL_AND_DECODING.md §6).

* :mod:`.state` — the window-state pytrees and the pure, fixed-shape decision functions that every
  engine calls (packing, position penalty, survival, commits, stop test, fallback, injection rows,
  outer-loop bookkeeping);
* :mod:`.window` — one request's window: its shapes, inputs, prefill, begin / open / pass / close,
  and its result; every engine is built from these pieces;
* :mod:`.portable` — the portable engine: the pieces jitted one by one, Python host loop;
* :mod:`.compiled` — the compiled engine: one ``lax.while_loop`` program per shape bucket;
* :mod:`.batched` — the batch program (``B`` requests in one program) and :mod:`.scheduler`, its
  host loop (continuous batching);
* :mod:`.layout` — where the compiled programs run (one device or a mesh);
* :mod:`.programs` — the process's store of compiled programs;
* :mod:`.result` — the raw :class:`~.result.DecodeOutput`, the §6.6 result dict and the §9.2
  token-layer-call counters (no JAX).

Submodules are imported explicitly (``from alodlm_jax.decode.portable import PortableEngine``) so
that importing this package stays cheap.
"""
