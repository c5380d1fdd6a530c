"""Visual reports of evaluation runs and quality-speed sweeps.

* :mod:`alodlm_jax.report.loading` reads an evaluation output directory (``summary.json`` and
  ``predictions.jsonl``, SCORING.md §7) into plain data;
* :mod:`alodlm_jax.report.stats` derives the series each figure shows (pure functions; a series
  whose keys are absent, as in rescored outputs, comes back empty with the reason);
* :mod:`alodlm_jax.report.figures` draws the PNG figures with matplotlib's Agg backend;
* :mod:`alodlm_jax.report.html` writes the self-contained ``report.html``;
* :mod:`alodlm_jax.report.build` strings these together for one run;
* :mod:`alodlm_jax.report.sweep` runs a q/tau/mode grid, resumable point by point, and draws the
  quality-speed frontiers.

Nothing here imports JAX; only the sweep's model-backed point runner does, lazily.
"""
