"""The harness model is declared under lm-eval's plugin entry-point group, so lm-eval releases
that discover plugins there find ``--model alodlm-jax`` without our wrapper command."""

from __future__ import annotations

import importlib.metadata
import pathlib
import tomllib

import pytest

from alodlm_jax.harness import MODEL_NAME

PYPROJECT = pathlib.Path(__file__).parents[2] / "pyproject.toml"


def test_pyproject_declares_the_model_under_lm_eval_models():
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert project["entry-points"]["lm_eval.models"] == {
        MODEL_NAME: "alodlm_jax.harness.model:AlodlmJaxLM"}


def test_the_installed_entry_point_loads_the_registered_model():
    pytest.importorskip("lm_eval")
    from lm_eval.api.registry import get_model

    points = [point for point in importlib.metadata.entry_points(group="lm_eval.models")
              if point.name == MODEL_NAME]
    assert points, "the installed distribution declares no lm_eval.models entry point"
    assert all(point.load() is get_model(MODEL_NAME) for point in points)
