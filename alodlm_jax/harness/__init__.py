"""alodlm-jax as a model of EleutherAI's lm-evaluation-harness (``lm-eval``, optional extra).

* :mod:`.model_args` — lm-eval's ``model_args`` read as the evaluate command's flags (same names in
  underscore spelling, same defaults and checks); no JAX, no lm-eval.
* :mod:`.until` — what a request's ``until`` strings do to a generation (the cut, the early stop);
  no JAX, no lm-eval.
* :mod:`.errors` — the user-facing failures (one line, exit status 2 from the command).
* :mod:`.model` — :class:`~alodlm_jax.harness.model.AlodlmJaxLM`, registered with lm-eval as
  ``alodlm-jax``; imports lm-eval.

The command ``alodlm-jax-lm-eval`` (:mod:`alodlm_jax.cli.lm_eval`) is lm-eval's own command line
with this model registered. Importing this package imports neither lm-eval nor JAX, and nothing
else in the project imports :mod:`.model` (the base install works without lm-eval).
"""

MODEL_NAME = "alodlm-jax"  # the name the model is registered under in lm-eval
