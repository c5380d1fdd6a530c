"""Shared fixtures of the lm-eval harness tests."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(autouse=True)
def _lm_eval_log_handlers():
    """lm-eval's command line adds a log handler on the captured stderr of the test that ran it:
    removed after each test, so later tests do not log into a closed stream."""
    logger = logging.getLogger("lm_eval")
    before = list(logger.handlers)
    yield
    for handler in logger.handlers[:]:
        if handler not in before:
            logger.removeHandler(handler)
