"""Benchmark alodlm-jax-convert on a synthetic sharded BF16 checkpoint of a chosen size.

Writes a Qwen3-shaped checkpoint (ALoDLM-1.7B's widths: V 151936, H 2048, I 6144, 16/8/128 heads;
as many layers as the size asks for) with random finite BF16 values, in ~1 GB shards plus an
index, config.json, alodlm_config.json and an exit_gate.pt in torch's zip format — all written by
our own safetensors writer and a minimal pickle, so no torch is needed. Then converts it in a
child process and reports wall seconds, MB/s and the child's peak RSS (ru_maxrss of the waited
child), and deletes everything.

Goals: peak RSS <= 25 % of the checkpoint size, >= 200 MB/s.

    python scripts/bench_convert.py --size_gb 2 [--dtype keep] [--workdir /tmp]

The source files were just written, so they are read from the page cache (a warm-cache number).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

import ml_dtypes
import numpy as np

from alodlm_convert.safetensors_io import SafetensorsWriter, TensorSpec
from alodlm_convert.transforms import cast

V, H, I, NQ, NKV, DH = 151936, 2048, 6144, 16, 8, 128
BF16 = np.dtype(ml_dtypes.bfloat16)
SHARD_BYTES = 1 << 30


def _layer_tensors(i: int) -> list[tuple[str, tuple[int, ...]]]:
    p = f"model.layers.{i}."
    return [(p + "input_layernorm.weight", (H,)), (p + "post_attention_layernorm.weight", (H,)),
            (p + "self_attn.q_proj.weight", (NQ * DH, H)), (p + "self_attn.k_proj.weight", (NKV * DH, H)),
            (p + "self_attn.v_proj.weight", (NKV * DH, H)), (p + "self_attn.o_proj.weight", (H, NQ * DH)),
            (p + "self_attn.q_norm.weight", (DH,)), (p + "self_attn.k_norm.weight", (DH,)),
            (p + "mlp.gate_proj.weight", (I, H)), (p + "mlp.up_proj.weight", (I, H)),
            (p + "mlp.down_proj.weight", (H, I))]


def _random_bf16(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Random finite BF16 values in about [-2, 2] (sign bit + exponents 0x3c..0x3f)."""
    bits = rng.integers(0x3C00, 0x4000, size=shape, dtype=np.uint16)
    bits |= (rng.integers(0, 2, size=shape, dtype=np.uint16) << 15)
    return bits.view(BF16)


def _gate_pickle(tensors: dict[str, tuple[int, ...]]) -> bytes:
    """A protocol-2 pickle of a dict of FloatStorage tensors, the shape torch.save writes."""
    i = lambda n: b"J" + int(n).to_bytes(4, "little", signed=True)
    s = lambda text: b"X" + len(text.encode()).to_bytes(4, "little") + text.encode()
    tup = lambda xs: b"(" + b"".join(i(x) for x in xs) + b"t"
    body = b""
    for key, (name, shape) in enumerate(tensors.items()):
        numel = math.prod(shape)
        strides = tuple(math.prod(shape[d + 1:]) for d in range(len(shape)))
        body += (s(name) + b"ctorch._utils\n_rebuild_tensor_v2\n(" + b"(" + s("storage") +
                 b"ctorch\nFloatStorage\n" + s(str(key)) + s("cpu") + i(numel) + b"tQ" + i(0) +
                 tup(shape) + tup(strides) + b"\x89ccollections\nOrderedDict\n)RtR")
    return b"\x80\x02}(" + body + b"u."


def write_gate(path: pathlib.Path, depth: int = 4) -> None:
    rng = np.random.default_rng(1)
    values = {"net.weight": rng.standard_normal((1, H)).astype(np.float32),
              "net.bias": np.array([-0.25], np.float32),
              "depth_bias": np.array([-0.7, 0.2, 0.8, 0.0][:depth], np.float32)}
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("exit_gate/data.pkl", _gate_pickle({k: v.shape for k, v in values.items()}))
        z.writestr("exit_gate/byteorder", "little")
        z.writestr("exit_gate/version", "3\n")
        for key, v in enumerate(values.values()):
            z.writestr(f"exit_gate/data/{key}", v.tobytes())


def write_checkpoint(out: pathlib.Path, size_gb: float, seed: int = 0, *, dtype: np.dtype = BF16,
                     vocab: int = V) -> int:
    """Writes the synthetic checkpoint (``dtype``: BF16 or float32 tensors; ``vocab`` rows of the
    embedding and the head); returns the total bytes of its safetensors files."""
    out.mkdir(parents=True)
    dtype = np.dtype(dtype)
    item = dtype.itemsize
    fixed = (2 * vocab * H + H) * item
    per_layer = sum(math.prod(s) for _, s in _layer_tensors(0)) * item
    layers = max(2, math.ceil((size_gb * 1e9 - fixed) / per_layer))
    names = [("model.embed_tokens.weight", (vocab, H))]
    for i in range(layers):
        names += _layer_tensors(i)
    names += [("model.norm.weight", (H,)), ("lm_head.weight", (vocab, H))]
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in names:
        nbytes = math.prod(shape) * item
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    rng = np.random.default_rng(seed)
    weight_map = {}
    total = 0
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        specs = [TensorSpec(n, dtype, s) for n, s in shard]
        with SafetensorsWriter(out / fname, specs, {"format": "pt"}) as writer:
            for name, shape in shard:
                writer.write(name, cast(_random_bf16(rng, shape), dtype))
                weight_map[name] = fname
        total += (out / fname).stat().st_size
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": vocab, "hidden_size": H,
              "intermediate_size": I, "num_hidden_layers": layers, "num_attention_heads": NQ,
              "num_key_value_heads": NKV, "head_dim": DH, "max_position_embeddings": 40960,
              "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
              "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu",
              "use_sliding_window": False, "dtype": "bfloat16" if dtype == BF16 else "float32"}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    quarter = layers // 4
    (out / "alodlm_config.json").write_text(json.dumps(
        {"loop_start": quarter, "loop_end": layers - quarter, "max_depth": 4,
         "mask_token_id": min(151665, vocab - 1)}))
    write_gate(out / "exit_gate.pt")
    return total


_CHILD = """
import json, sys, time
from alodlm_convert.convert import convert_checkpoint
start = time.perf_counter()
convert_checkpoint(sys.argv[1], sys.argv[2], sys.argv[3])
seconds = time.perf_counter() - start
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")]
print(json.dumps({"seconds": seconds, "vm_hwm_kib": int(hwm[0].split()[1]) if hwm else None}))
"""


def _run_child(argv: list[str], env: dict[str, str] | None = None,
               cwd: str | None = None) -> tuple[int, str, str, int, float]:
    """Runs a child; returns (status, stdout, stderr, its peak RSS in bytes, its CPU seconds).

    ``os.wait4`` gives this child's rusage alone (RUSAGE_CHILDREN would mix in other children).
    """
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=cwd)
    out, err = proc.stdout.read(), proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, out, err, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime  # KiB


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size_gb", type=float, default=2.0)
    parser.add_argument("--dtype", choices=["keep", "fp32", "bf16"], default="keep")
    parser.add_argument("--workdir", default=None, help="where to put the temporary files")
    parser.add_argument("--keep_files", action="store_true", help="do not delete the files afterwards")
    parser.add_argument("--generate_only", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.generate_only:
        print(write_checkpoint(pathlib.Path(args.generate_only), args.size_gb))
        return 0

    root = pathlib.Path(tempfile.mkdtemp(prefix="bench_convert_", dir=args.workdir))
    try:
        # Generate in a child so this process stays small (a forked child starts with our RSS).
        t0 = time.perf_counter()
        status, out, err, _, _ = _run_child([sys.executable, __file__, "--size_gb", str(args.size_gb),
                                          "--generate_only", str(root / "hf")])
        if status != 0:
            print(err, file=sys.stderr)
            return 1
        src_bytes = int(out.strip())
        os.sync()  # do not charge the generator's disk writeback to the conversion
        print(f"generated {src_bytes / 1e9:.2f} GB checkpoint in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)

        t1 = time.perf_counter()
        status, out, err, peak_rss, cpu = _run_child([sys.executable, "-c", _CHILD, str(root / "hf"),
                                                 str(root / "out"), args.dtype])
        wall = time.perf_counter() - t1
        if status != 0:
            print(err, file=sys.stderr)
            return 1
        t2 = time.perf_counter()
        os.sync()
        sync_seconds = time.perf_counter() - t2
        report = json.loads(out.strip().splitlines()[-1])
        inner = report["seconds"]
        out_bytes = (root / "out" / "params.safetensors").stat().st_size
        result = {
            "checkpoint_bytes": src_bytes,
            "dtype": args.dtype,
            "output_bytes": out_bytes,
            "convert_seconds": round(inner, 2),
            "process_seconds": round(wall, 2),
            "mb_per_s": round(src_bytes / 1e6 / inner, 1),
            "child_cpu_seconds": round(cpu, 2),
            "load_average_1min": os.getloadavg()[0],
            "sync_after_seconds": round(sync_seconds, 2),
            "mb_per_s_including_sync": round(src_bytes / 1e6 / (inner + sync_seconds), 1),
            "peak_rss_bytes": peak_rss,
            "child_vm_hwm_bytes": report["vm_hwm_kib"] * 1024 if report["vm_hwm_kib"] else None,
            "peak_rss_fraction": round(peak_rss / src_bytes, 4),
            "goal_rss_le_25pct": peak_rss <= 0.25 * src_bytes,
            "goal_ge_200_mb_per_s": src_bytes / 1e6 / inner >= 200,
        }
        print(json.dumps(result, indent=2))
        return 0
    finally:
        if not args.keep_files:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
