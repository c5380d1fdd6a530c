"""JAX's persistent compilation cache can be switched on for the compiled engine."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import pytest

from alodlm_jax.decode.compiled import enable_persistent_cache

_SCRIPT = """
import json, sys
from alodlm_jax.config import DecodeConfig
from alodlm_jax.decode.compiled import CompiledEngine
from alodlm_jax.network.params import load_model
cfg, params = load_model(sys.argv[1], "fp32")
engine = CompiledEngine(cfg, params, DecodeConfig(max_new_tokens=8, window_size=2), [2],
                        compilation_cache_dir=sys.argv[2], measure_prefill=False)
out = engine.generate([4, 5, 6])
print(json.dumps({"tokens": out.token_ids, "compile_seconds": engine.compile_seconds}))
"""


def test_enable_persistent_cache_sets_jax_config(tmp_path):
    before = jax.config.jax_compilation_cache_dir
    try:
        enable_persistent_cache(None)  # off: nothing changes
        assert jax.config.jax_compilation_cache_dir == before
        enable_persistent_cache(str(tmp_path))
        assert jax.config.jax_compilation_cache_dir == str(tmp_path)
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


@pytest.mark.slow
def test_programs_land_in_the_persistent_cache(checkpoints, tmp_path):
    checkpoints.get("sandwich", 0, 6.0)
    path = next(p for p in checkpoints.root.iterdir() if p.name.startswith("sandwich-0-6"))
    cache_dir = tmp_path / "jax_cache"

    def run():
        done = subprocess.run([sys.executable, "-c", _SCRIPT, str(path), str(cache_dir)],
                              capture_output=True, text=True, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    first = run()
    assert any(cache_dir.iterdir())
    second = run()
    assert second["tokens"] == first["tokens"]
    assert second["compile_seconds"] < first["compile_seconds"]
