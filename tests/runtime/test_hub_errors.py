"""A Hub id that cannot be fetched is one line naming the model, the cache looked in and the
alternatives, exit status 2, no traceback (nothing here reaches the network)."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx2
import pytest
from huggingface_hub import constants, errors

from alodlm_convert.resolve import ModelNotFoundError, resolve_model
from alodlm_jax.cli import generate as generate_cli

MODEL = "amazon/ALoDLM-1.7B"


def _unreachable(**kwargs):
    """What ``snapshot_download`` raises when the Hub cannot be reached and nothing is cached."""
    try:
        raise httpx2.ConnectError("[Errno -2] Name or service not known")
    except httpx2.ConnectError as error:
        raise errors.LocalEntryNotFoundError(
            f"Got: {type(error).__name__}: {error}\nAn error happened while trying to locate the "
            "files on the Hub") from error


def _unknown(**kwargs):
    request = httpx2.Request("GET", f"https://huggingface.co/api/models/{kwargs['repo_id']}")
    raise errors.RepositoryNotFoundError("404 Client Error: Repository Not Found",
                                         response=httpx2.Response(404, request=request))


def _one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_unreachable_hub_names_model_cache_and_alternatives(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("huggingface_hub.snapshot_download", _unreachable)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model(MODEL)
    message = str(info.value)
    assert "\n" not in message and MODEL in message and str(tmp_path / "hub") in message
    assert "ConnectError: [Errno -2] Name or service not known" in message
    assert "local model directory" in message and "HF_HUB_OFFLINE=1" in message
    status = generate_cli.main(["alodlm-jax-generate", "--model", MODEL, "--prompt_ids", "1,2"])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert _one_line(err).startswith(f"alodlm-jax-generate: error: {message}")


def test_unknown_model_id(monkeypatch):
    monkeypatch.setattr("huggingface_hub.snapshot_download", _unknown)
    with pytest.raises(ModelNotFoundError, match="no model of that name .* HF_TOKEN"):
        resolve_model("example/no-such-model")


def test_offline_without_a_cached_copy_command(tmp_path):
    """The real ``snapshot_download`` with ``HF_HUB_OFFLINE=1`` and an empty ``HF_HOME``."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    done = subprocess.run([sys.executable, "-c", "from alodlm_jax.cli.generate import run; run()",
                           "--model", MODEL, "--prompt_ids", "1,2"], env=env, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    err = _one_line(done.stderr)
    assert MODEL in err and "HF_HUB_OFFLINE=1 is set" in err and str(tmp_path / "hf" / "hub") in err
    assert "local model directory" in err and f"hf download {MODEL}" in err
