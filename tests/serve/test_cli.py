"""The command's refusals: one line, exit status 2, before any model is loaded."""

from __future__ import annotations

import pytest

from alodlm_jax.cli import serve


@pytest.mark.parametrize("argv, words", [
    ([], "--model"),
    (["--model", "builtin:tiny", "--batch_size", "auto"], "--batch_size"),
    (["--model", "builtin:tiny", "--engine", "portable"], "--engine"),
    (["--model", "builtin:tiny", "--port", "0"], "--port"),
    (["--model", "builtin:tiny", "--window_size", "0"], "--window_size"),
])
def test_bad_flags_are_one_line_and_status_2(argv, words, capsys):
    assert serve.main(["alodlm-jax-serve", *argv]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("alodlm-jax-serve: error:"), err
    assert words in lines[0]
