"""alodlm_prepare: from the benchmarks' own files to a ready evaluation suite (``alodlm-jax-prepare``).

Modules: ``benchmarks`` (the guide's eleven benchmarks: metric, default source, columns, template),
``sources`` (hub datasets and local files through ``datasets``; EvalPlus release files through
evalplus), ``choices``, ``problems`` and ``programs`` (source rows to items, per kind of task),
``templates`` (Jinja prompt templates and the checkpoint's chat template), ``literals`` (JSON or
Python literal for EvalPlus suites), ``groundtruth_cache``, ``manifest``, ``files`` (atomic
writes), ``suite`` (the whole preparation), ``fixtures`` (hand-made rows in each source's real
layout, for tests and the bundled sample suite) and ``sample_slice`` (the bundled suite's prepared
part). Expected outputs and timings are measured by :mod:`alodlm_scoring.groundtruth`.

This package imports no JAX.
"""
