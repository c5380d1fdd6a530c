"""The user-facing failures of the lm-eval model (no JAX, no lm-eval).

``alodlm-jax-lm-eval`` prints any :class:`HarnessError` as one line and exits with status 2; in
Python they are ``ValueError``s.
"""


class HarnessError(ValueError):
    """A bad ``model_args`` value, task setting or prompt, or a model that cannot be loaded."""


class ModelArgsError(HarnessError):
    """A bad ``model_args`` key or value (the line names it)."""


class UnsupportedRequestError(HarnessError):
    """A request type this decoder cannot answer (loglikelihood, loglikelihood_rolling)."""
