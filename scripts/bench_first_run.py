"""How long the first batch of a fresh process takes: compiling the batch and admit programs, then
decoding.

    python scripts/bench_first_run.py                     # the 1.7B's tiny shape, batch 4, fp32
    python scripts/bench_first_run.py --shape 8b --batch 8 --dtype bf16 --repeats 3

Each repeat is a fresh Python process with no compilation cache, so every program compiles: the
script prints each run's wall time of the first ``generate_batch`` (compiles included), the
engine's compile seconds (summed over programs; two may compile at once) and the tokens decoded.
The released shapes themselves (``--full_shapes``) need an accelerator's memory; on a CPU the
tiny shapes measure the same programs' structure.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

CHILD = """
import json, sys, time
sys.path[:0] = [sys.argv[1]]
import jax.numpy as jnp
import numpy as np
from alodlm_jax.config import DecodeConfig
from alodlm_jax.decode.compiled import CompiledEngine
from alodlm_jax.testing.released_shapes import model_config, random_params
args = json.loads(sys.argv[2])
cfg = model_config(args["shape"], tiny=args["tiny"])
params = random_params(cfg, jnp.dtype(args["dtype"]), seed=0)
decode = DecodeConfig(q=0.5, tau=0.4, window_size=args["window_size"],
                      max_new_tokens=args["max_new_tokens"], mode="entropy")
rng = np.random.default_rng(0)
prompts = [rng.integers(0, cfg.mask_token_id, size=args["prompt_tokens"]).tolist()
           for _ in range(2 * args["batch"])]
engine = CompiledEngine(cfg, params, decode, [], batch_size=args["batch"], measure_prefill=False)
t0 = time.perf_counter()
outs = engine.generate_batch(prompts)
print(json.dumps({"wall_seconds": time.perf_counter() - t0,
                  "compile_seconds": engine.compile_seconds,
                  "tokens": sum(len(o.token_ids) for o in outs)}))
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="1.7b", choices=("1.7b", "8b"))
    parser.add_argument("--full_shapes", action="store_true",
                        help="the released shapes themselves (default: their tiny versions)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--window_size", type=int, default=16)
    parser.add_argument("--prompt_tokens", type=int, default=24)
    parser.add_argument("--max_new_tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    for flag in ("batch", "window_size", "prompt_tokens", "max_new_tokens", "repeats"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be at least 1, not {getattr(args, flag)}")
    root = str(pathlib.Path(__file__).resolve().parents[1])
    settings = dict(shape=args.shape, tiny=not args.full_shapes, batch=args.batch,
                    dtype=args.dtype, window_size=args.window_size,
                    prompt_tokens=args.prompt_tokens, max_new_tokens=args.max_new_tokens)
    print(f"first batch of a fresh process: {settings}", flush=True)
    for repeat in range(args.repeats):
        done = subprocess.run([sys.executable, "-c", CHILD, root, json.dumps(settings)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            return 1
        run = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"  run {repeat + 1}: first generate_batch {run['wall_seconds']:.1f} s, compile "
              f"seconds {run['compile_seconds']:.1f}, {run['tokens']} tokens", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
