"""Suite tokens/s of the compiled engine with continuous batching on each layout, on the same
prompts, with the HLO collectives of one batch step (``alodlm_jax.decode.layout``).

    python scripts/bench_scaleout.py              # bench_decode's small model, 32 prompts x 64 tokens
    python scripts/bench_scaleout.py --quick      # 8 prompts x 16 tokens, fewer layouts
    python scripts/bench_scaleout.py --json /tmp/scaleout.json

Every layout runs in a fresh interpreter (``XLA_FLAGS=--xla_force_host_platform_device_count``
must be set before JAX starts), compiles its programs first (reported apart), then decodes all
prompts ``--repeats`` times; tokens/s = generated tokens / the best decode wall time. Every layout's tokens are compared
with the one-device batch-1 run's ("same tokens").

On a CPU, simulated devices share the machine's cores: a one-device program of a small model keeps
about one core busy, while several simulated devices run their parts on separate threads, so a
mesh can beat one device here for that reason alone (and tensor parallelism pays its all-reduces
in memory copies); none of it says how an accelerator scales. The data-parallel measurement here
is by processes: ``pinned`` runs one process on one core
(``taskset -c 0``) over all prompts against two processes, each pinned to its own core, over half
the prompts each (what ``--num_processes 2`` does during decoding: no collective, its own batch);
efficiency = (two processes' suite tokens/s) / (2 x one process's). Both processes start each
decode run together (a file barrier); the suite time is the slower one's. The same formula for a
pure-Python loop (:func:`machine_control`) shows what the machine itself gives two processes at
that moment (a shared 2-vCPU machine gave 0.4-0.8).

Checkpoint: bench_decode.py's ``small`` (6 layers, H 128, 4 heads, 2 KV heads, vocab 1024),
random weights, built once under --workdir. No stop ids: every request generates exactly
``max_new_tokens`` tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve()
ROOT = HERE.parents[1]

# (label, simulated devices, mesh, batch size): one process each.
LAYOUTS = [
    ("1 device, batch 1", 1, None, 1),
    ("1 device, batch 8", 1, None, 8),
    ("data=2, batch 8", 2, "data=2", 8),
    ("model=2, batch 1", 2, "model=2", 1),
    ("data=2,model=2, batch 8", 4, "data=2,model=2", 8),
    ("data=4, batch 8", 4, "data=4", 8),
]
QUICK = ("1 device, batch 1", "1 device, batch 8", "data=2, batch 8", "data=2,model=2, batch 8")


def worker(spec: dict) -> dict:
    """One process: build the generator on its mesh, compile, (wait at the barrier,) decode."""
    import numpy as np

    from alodlm_jax.plan.analysis import collectives, step_collectives
    from alodlm_jax.config import DecodeConfig
    from alodlm_jax.decode import batched
    from alodlm_jax.generate import build_generator
    from alodlm_jax.network.sharding import MeshSpec

    decode = DecodeConfig(q=0.5, tau=0.4, window_size=4, max_new_tokens=spec["max_new_tokens"])
    gen = build_generator(model=spec["model"], mesh=MeshSpec.parse(spec["mesh"]), device="cpu",
                          precision="fp32", decode_config=decode, engine="compiled",
                          batch_size=spec["batch"])
    engine = gen.engine
    engine.stop_ids = []  # every request runs to max_new_tokens: equal work on every layout
    rng = np.random.default_rng(7)
    prompts = [rng.integers(13, gen.cfg.vocab_size, size=spec["prompt_tokens"]).tolist()
               for _ in range(spec["prompts"])]
    prompts = prompts[spec.get("share", 0)::spec.get("shares", 1)]
    t0 = time.perf_counter()
    report: dict = {}
    if spec["batch"] > 1:
        bucket = engine.bucket_for(len(prompts[0]), batch=spec["batch"])
        text = batched.compile_batch(engine, bucket)[0].as_text()
        engine.generate_batch(prompts[:1])  # a warm execution
    else:
        text = engine.compile_for(engine.bucket_for(len(prompts[0]))).as_text()
        engine.generate(prompts[0])
    report["compile_seconds"] = time.perf_counter() - t0
    report["step_collectives"] = step_collectives(text) if spec["batch"] > 1 else None
    kinds: dict[str, int] = {}
    for c in collectives(text):
        kinds[c["kind"]] = kinds.get(c["kind"], 0) + 1
    report["program_collectives"] = kinds
    walls = []
    for repeat in range(spec["repeats"]):
        if spec.get("barrier"):  # every process starts each repetition together
            barrier = pathlib.Path(spec["barrier"])
            (barrier / f"ready-{repeat}-{spec['share']}").touch()
            while len(list(barrier.glob(f"ready-{repeat}-*"))) < spec["shares"]:
                time.sleep(0.005)
        t0 = time.perf_counter()
        outs = ([engine.generate(p) for p in prompts] if spec["batch"] == 1
                else engine.generate_batch(prompts))
        walls.append(time.perf_counter() - t0)
    report["walls"] = walls
    report["wall_seconds"] = min(walls)
    report["tokens"] = [o.token_ids for o in outs]
    report["generated"] = sum(len(o.token_ids) for o in outs)
    return report


def launch(spec: dict, devices: int, core: int | None) -> subprocess.Popen:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                        f" --xla_force_host_platform_device_count={devices}").strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    command = [sys.executable, str(HERE), "--worker", json.dumps(spec)]
    if core is not None:
        command = ["taskset", "-c", str(core)] + command
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=str(ROOT))


def finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"worker failed:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def run_layouts(base: dict, chosen) -> list[dict]:
    rows = []
    for label, devices, mesh, batch in LAYOUTS:
        if label not in chosen:
            continue
        result = finish(launch(dict(base, mesh=mesh, batch=batch), devices, None))
        rows.append({"layout": label, "processes": 1, "cores": "shared (2)", **result})
        print_row(rows[-1], rows[0])
    return rows


def run_pinned(base: dict, batch: int) -> list[dict]:
    """One process on core 0 over all prompts; two processes on cores 0 and 1 over half each."""
    rows = []
    one = finish(launch(dict(base, mesh=None, batch=batch), 1, 0))
    rows.append({"layout": f"1 process on 1 core, batch {batch}", "processes": 1, "cores": "0", **one})
    with tempfile.TemporaryDirectory() as barrier:
        procs = [launch(dict(base, mesh=None, batch=batch, share=i, shares=2, barrier=barrier), 1, i)
                 for i in range(2)]
        parts = [finish(p) for p in procs]
    tokens: list = [None] * base["prompts"]
    for i, part in enumerate(parts):
        tokens[i::2] = part["tokens"]
    rows.append({"layout": f"2 processes on 1 core each, batch {batch} each", "processes": 2,
                 "cores": "0 | 1", "compile_seconds": max(p["compile_seconds"] for p in parts),
                 "walls": [max(w) for w in zip(*(p["walls"] for p in parts))],
                 "wall_seconds": min(max(w) for w in zip(*(p["walls"] for p in parts))),
                 "generated": sum(p["generated"] for p in parts), "tokens": tokens,
                 "step_collectives": parts[0]["step_collectives"],
                 "program_collectives": parts[0]["program_collectives"]})
    return rows


SPIN = "import time\nt = time.perf_counter()\nx = 0\nfor i in range(20_000_000): x += i\n" \
       "print(time.perf_counter() - t)"


def machine_control() -> float:
    """The same efficiency formula for a pure-Python loop (no JAX): one process on core 0, then
    one on each core at once. What the machine gives two processes right now (shared cores, other
    work, a VM's vCPUs), against which the decoders' efficiency is to be read."""
    def spin(core: int) -> subprocess.Popen:
        return subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", SPIN],
                                stdout=subprocess.PIPE, text=True)

    alone = float(spin(0).communicate()[0])
    procs = [spin(0), spin(1)]
    together = max(float(p.communicate()[0]) for p in procs)
    return (2 / together) / (2 * (1 / alone))


def print_row(row: dict, base: dict) -> None:
    rate = row["generated"] / row["wall_seconds"]
    row["tokens_per_second"] = rate
    row["same_tokens"] = row["tokens"] == base["tokens"]
    print(f"{row['layout']:<44} {rate:9.1f} tok/s  wall {row['wall_seconds']:7.2f} s  compile "
          f"{row['compile_seconds']:6.1f} s  same tokens: {'yes' if row['same_tokens'] else 'NO'}  "
          f"collectives in program: {row['program_collectives'] or 'none'}", flush=True)
    if row.get("step_collectives"):
        total = sum(row["step_collectives"].values())
        print(f"{'':<44} one batch step: {total} collectives {row['step_collectives']}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--prompts", type=int, default=None)
    parser.add_argument("--max_new_tokens", type=int, default=None)
    parser.add_argument("--prompt_tokens", type=int, default=12)
    parser.add_argument("--pinned_batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="decode runs per layout (best "
                        "taken; the two pinned processes start each run together)")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "alodlm-bench"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    sys.path.insert(0, str(HERE.parent))
    from bench_decode import build_checkpoint  # the same generated checkpoint

    model = build_checkpoint(pathlib.Path(args.workdir), "small", None)
    base = {"model": str(model), "prompt_tokens": args.prompt_tokens,
            "prompts": args.prompts or (8 if args.quick else 32),
            "max_new_tokens": args.max_new_tokens or (16 if args.quick else 64),
            "repeats": args.repeats}
    print(f"small model, {base['prompts']} prompts x {base['max_new_tokens']} new tokens, best of "
          f"{base['repeats']} decode runs, {os.cpu_count()} CPU cores, load average "
          f"{os.getloadavg()[0]:.1f} at the start", flush=True)
    rows = run_layouts(base, QUICK if args.quick else [label for label, *_ in LAYOUTS])
    pinned = run_pinned(base, args.pinned_batch)
    for row in pinned:
        print_row(row, rows[0])
    efficiency = pinned[1]["tokens_per_second"] / (2 * pinned[0]["tokens_per_second"])
    control = machine_control()
    print(f"data-parallel efficiency over 2 processes (1 core each): {efficiency:.2f}; the same "
          f"formula for a pure-Python loop (the machine's own): {control:.2f}; load average "
          f"{os.getloadavg()[0]:.1f} at the end (other work on the machine shares the cores)")
    if args.json:
        for row in rows + pinned:
            row.pop("tokens")
        pathlib.Path(args.json).write_text(json.dumps({"base": base, "layouts": rows,
                                                       "pinned": pinned, "efficiency": efficiency,
                                                       "machine_efficiency": control}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
