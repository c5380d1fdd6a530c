"""The commands keep JAX's persistent compilation cache in the user's cache directory by default
(bounded in size; --nocompilation_cache turns it off), and a second run reads its programs back."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest
from absl import flags

from alodlm_jax.cli import generate as generate_cli
from alodlm_jax.cli.flags import (apply_compilation_flags, default_compilation_cache_dir,
                                  define_compilation_flags, parse_flags)
from alodlm_jax.config import DEFAULT_MAX_PROGRAMS
from alodlm_jax.decode import programs


def test_the_suite_never_writes_into_the_users_cache():
    cache_home = pathlib.Path(os.environ["XDG_CACHE_HOME"])
    assert cache_home.is_relative_to(tempfile.gettempdir())
    assert default_compilation_cache_dir() == cache_home / "alodlm-jax" / "xla"


@pytest.mark.parametrize("value", [None, "", "relative/dir"])
def test_default_directory_without_an_absolute_xdg_cache_home(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("XDG_CACHE_HOME")
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", value)
    assert default_compilation_cache_dir() == pathlib.Path.home() / ".cache" / "alodlm-jax" / "xla"


def _flags(*argv: str) -> flags.FlagValues:
    fv = flags.FlagValues()
    define_compilation_flags(fv)
    parse_flags(["prog", *argv], fv)
    return fv


def test_flags_choose_the_directory_and_the_program_bound(tmp_path):
    try:
        assert apply_compilation_flags(_flags()) == str(default_compilation_cache_dir())
        assert programs.PROGRAMS.max_programs == DEFAULT_MAX_PROGRAMS
        assert apply_compilation_flags(_flags(f"--compilation-cache-dir={tmp_path}")) == str(tmp_path)
        assert apply_compilation_flags(_flags("--nocompilation_cache")) is None
        assert apply_compilation_flags(_flags("--no-compilation-cache")) is None
        assert apply_compilation_flags(_flags("--max_compiled_programs=5")) is not None
        assert programs.PROGRAMS.max_programs == 5
    finally:
        programs.set_max_programs(DEFAULT_MAX_PROGRAMS)


def test_a_bad_program_bound_is_a_one_line_error_before_loading(capsys):
    status = generate_cli.main(["alodlm-jax-generate", "--model", "/no/such/model", "--prompt_ids",
                                "1", "--max_compiled_programs", "0"])
    _, err = capsys.readouterr()
    assert status == 2 and err.count("\n") == 1 and "--max_compiled_programs" in err
    assert programs.PROGRAMS.max_programs == DEFAULT_MAX_PROGRAMS


def _generate(cache_home: pathlib.Path, *extra: str) -> tuple[dict, dict]:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache_home))
    done = subprocess.run(
        [sys.executable, "-c", "from alodlm_jax.cli.generate import run; run()", "--model",
         "builtin:tiny", "--prompt_ids", "4,5,6", "--max_new_tokens", "4", "--window_size", "1",
         "--stats", *extra], env=env, capture_output=True, text=True, timeout=600, cwd=cache_home)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), json.loads(done.stderr.strip().splitlines()[-1])


def _entries(directory: pathlib.Path) -> dict[str, bytes]:
    """Cache entry -> its last-access stamp (JAX's bounded cache rewrites it on every hit)."""
    return {p.name[: -len("-cache")]: (directory / (p.name[: -len("-cache")] + "-atime")).read_bytes()
            for p in directory.glob("*-cache")}


def test_a_second_run_reads_its_programs_from_the_default_cache(tmp_path):
    cache = tmp_path / "alodlm-jax" / "xla"
    first, first_stats = _generate(tmp_path)
    written = _entries(cache)
    assert written, "the first run wrote no cache entries"
    second, second_stats = _generate(tmp_path)
    read_back = _entries(cache)
    assert set(read_back) == set(written)  # nothing compiled afresh, so nothing new written
    assert all(read_back[key] != written[key] for key in written)  # every entry was read again
    assert second["token_ids"] == first["token_ids"]
    assert first_stats["compile_seconds"] > 0 and second_stats["compile_seconds"] > 0
    # --nocompilation_cache: neither read nor written.
    _generate(tmp_path, "--nocompilation_cache")
    assert _entries(cache) == read_back
