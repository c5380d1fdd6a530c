"""The error of bad ``alodlm-jax-compare`` input (a file, a line, a field, a flag)."""

from __future__ import annotations

from alodlm_scoring.errors import InputFileError

__all__ = ["CompareInputError"]


class CompareInputError(InputFileError):
    """Bad user input: the CLI prints ``str(error)`` (``file:line: field 'x': message``) and exits 2.

    Prediction files are read by ``alodlm_scoring.predictions``, whose ``PredictionFileError`` has
    the same shape."""
