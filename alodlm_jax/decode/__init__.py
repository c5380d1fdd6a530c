"""Adaptive decoding (MODEL_AND_DECODING.md §6).

* :mod:`.state` — the window-state pytrees and the pure, fixed-shape decision functions that every
  engine calls (packing, position penalty, survival, commits, stop test, fallback, injection rows,
  outer-loop bookkeeping);
* :mod:`.portable` — the portable engine: jitted prefill and per-pass functions, Python host loop;
* :mod:`.result` — the raw :class:`~.result.DecodeOutput`, the §6.6 result dict and the §9.2
  token-layer-call counters (no JAX);
* ``compiled`` — the fully compiled engine (one ``lax.while_loop`` program per shape bucket).

Submodules are imported explicitly (``from alodlm_jax.decode.portable import PortableEngine``) so
that importing this package stays cheap.
"""
