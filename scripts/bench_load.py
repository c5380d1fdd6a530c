"""Benchmark peak host memory of loading a checkpoint and generating once, over the checkpoint size.

Writes a synthetic checkpoint of ALoDLM-1.7B's widths (``scripts/bench_convert.py``'s: V 151936,
H 2048, I 6144, 16/8/128 heads; as many layers as ``--size_gb`` asks for; float32 by default)
plus the bundled tiny
checkpoint's word-level tokenizer and chat template, then measures, each in a fresh child process
(peak RSS = the waited child's ``ru_maxrss``):

* ``generator``: ``build_generator(model=..., precision=fp32, device=cpu)`` and one generation
  (3 prompt tokens, ``--max_new_tokens``, window 2); the child also reports its peak right after loading;
* ``command``: ``alodlm-jax-generate --model DIR --prompt_ids 4,5,6 ...`` (the same settings).

On a CPU the device copy of the weights is host memory, so the floor is about 1.0x the checkpoint
(fp32 loaded as fp32) plus the runtime's own peak, which the script measures first with the same
child on the bundled tiny model (``runtime_baseline_peak_rss_bytes``: imports, JAX, tokenizer and
compiling the programs, several hundred MB that do not grow with the checkpoint) and subtracts in
``peak_above_baseline_over_checkpoint``. ``--source DIR`` imports the project from another source
tree (e.g. ``git archive <commit> | tar -x -C DIR``) for a before/after comparison on the same
checkpoint (the children run in a temporary directory, so the working directory's packages do not
shadow it); ``XDG_CACHE_HOME`` points at a temporary directory in the children, so the persistent
compilation cache starts empty and the user's is untouched.

    python scripts/bench_load.py --size_gb 3 [--vocab 151936] [--source OLD_TREE] [--workdir /tmp]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_convert import BF16, V, _run_child, write_checkpoint  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
PROMPT_IDS = "4,5,6"  # inside the tiny tokenizer's vocabulary

_GENERATOR_CHILD = """
import json, sys
def peak():
    return [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
from alodlm_jax.config import DecodeConfig
from alodlm_jax.generate import build_generator
gen = build_generator(model=sys.argv[1], precision="fp32", device="cpu", engine=sys.argv[2],
                     decode_config=DecodeConfig(max_new_tokens=int(sys.argv[3]), window_size=2))
after_load = peak()
result = gen.generate_ids([int(t) for t in sys.argv[4].split(",")])
import alodlm_jax
print(json.dumps({"after_load_peak_bytes": after_load, "tokens": result["token_ids"],
                  "package": alodlm_jax.__path__[0]}))
"""

_COMMAND_CHILD = "import sys; from alodlm_jax.cli.generate import main; sys.exit(main(sys.argv))"


def _source_path(tree: pathlib.Path, root: pathlib.Path) -> str:
    """A directory whose entries make ``tree``'s packages importable (``alodlm_convert`` lives in
    ``convert/``, ``alodlm_scoring`` in ``scoring/``)."""
    link_dir = root / "source"
    link_dir.mkdir()
    for package, folder in (("alodlm_jax", "alodlm_jax"), ("alodlm_convert", "convert"),
                            ("alodlm_scoring", "scoring")):
        (link_dir / package).symlink_to(tree.resolve() / folder)
    return str(link_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size_gb", type=float, default=3.0)
    parser.add_argument("--vocab", type=int, default=V)
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                        help="stored dtype of the checkpoint (it is always loaded as fp32)")
    parser.add_argument("--engine", choices=["compiled", "portable"], default="compiled")
    parser.add_argument("--max_new_tokens", type=int, default=4)
    parser.add_argument("--source", default=None, help="import the project from this source tree")
    parser.add_argument("--workdir", default=None, help="where to put the temporary files")
    parser.add_argument("--generate_only", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.max_new_tokens < 1 or args.vocab < 64 or args.size_gb <= 0:
        parser.error("--max_new_tokens must be >= 1, --vocab >= 64 and --size_gb > 0")
    if args.generate_only:
        out = pathlib.Path(args.generate_only)
        stored = np.dtype(np.float32) if args.dtype == "fp32" else BF16
        total = write_checkpoint(out, args.size_gb, dtype=stored, vocab=args.vocab)
        from alodlm_jax.data import BUILTINS

        for name in TOKENIZER_FILES:
            shutil.copy(BUILTINS["builtin:tiny"] / name, out / name)
        print(total)
        return 0

    root = pathlib.Path(tempfile.mkdtemp(prefix="bench_load_", dir=args.workdir))
    try:
        t0 = time.perf_counter()
        status, out, err, _, _ = _run_child([sys.executable, __file__, "--size_gb", str(args.size_gb),
                                             "--vocab", str(args.vocab), "--dtype", args.dtype,
                                             "--generate_only", str(root / "hf")])
        if status != 0:
            print(err, file=sys.stderr)
            return 1
        checkpoint_bytes = int(out.strip())
        os.sync()
        print(f"generated {checkpoint_bytes / 1e9:.2f} GB checkpoint in "
              f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)

        env = dict(os.environ, XDG_CACHE_HOME=str(root / "cache"))
        if args.source:
            env["PYTHONPATH"] = os.pathsep.join(
                [_source_path(pathlib.Path(args.source), root)] + env.get("PYTHONPATH", "").split(os.pathsep))
        model = str(root / "hf")
        result = {"checkpoint_bytes": checkpoint_bytes, "stored_dtype": args.dtype,
                  "vocab": args.vocab, "engine": args.engine, "source": args.source or "this tree"}

        def generator_run(model_dir: str):
            t1 = time.perf_counter()
            status, out, err, peak, _ = _run_child(
                [sys.executable, "-c", _GENERATOR_CHILD, model_dir, args.engine,
                 str(args.max_new_tokens), PROMPT_IDS], env=env, cwd=str(root))
            if status != 0:
                raise RuntimeError(err)
            report = json.loads(out.strip().splitlines()[-1])
            return dict(report, seconds=round(time.perf_counter() - t1, 1), peak_rss_bytes=peak)

        from alodlm_jax.data import BUILTINS

        try:
            # The same child on the bundled tiny model: the runtime's own peak (imports, JAX,
            # the tokenizer, compiling the programs), which does not grow with the checkpoint.
            baseline = generator_run(str(BUILTINS["builtin:tiny"]))["peak_rss_bytes"]
            run = generator_run(model)
        except RuntimeError as error:
            print(error, file=sys.stderr)
            return 1
        result["runtime_baseline_peak_rss_bytes"] = baseline
        peak = run["peak_rss_bytes"]
        result["generator"] = {
            "seconds": run["seconds"], "package": run["package"], "peak_rss_bytes": peak,
            "peak_rss_over_checkpoint": round(peak / checkpoint_bytes, 3),
            "peak_above_baseline_over_checkpoint": round((peak - baseline) / checkpoint_bytes, 3),
            "after_load_peak_over_checkpoint": round(run["after_load_peak_bytes"] / checkpoint_bytes, 3),
            "tokens": run["tokens"]}

        t2 = time.perf_counter()
        status, out, err, peak, _ = _run_child(
            [sys.executable, "-c", _COMMAND_CHILD, "--model", model,
             "--prompt_ids", PROMPT_IDS, "--max_new_tokens", str(args.max_new_tokens),
             "--window_size", "2", "--precision", "fp32", "--device", "cpu", "--engine", args.engine],
            env=env, cwd=str(root))
        if status != 0:
            print(err, file=sys.stderr)
            return 1
        result["command"] = {
            "seconds": round(time.perf_counter() - t2, 1), "peak_rss_bytes": peak,
            "peak_rss_over_checkpoint": round(peak / checkpoint_bytes, 3),
            "peak_above_baseline_over_checkpoint": round((peak - baseline) / checkpoint_bytes, 3),
            "tokens": json.loads(out.strip().splitlines()[-1])["token_ids"]}
        print(json.dumps(result, indent=2))
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
