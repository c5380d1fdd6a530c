"""Convert a Hugging Face ALoDLM checkpoint into our params directory, one tensor at a time.

Order of work, so that a bad checkpoint costs nothing and a failure leaves nothing behind:

1. validate everything from the configs, the safetensors headers and the small gate file
   (:func:`alodlm_convert.checkpoint.plan_hf_checkpoint`) — no weight data is read yet;
2. stream (:mod:`alodlm_convert.stream`): read a block of rows, transpose and cast it into our
   layout, write it at its final offset, hashing the source on the way; memory stays at a few
   blocks whatever the model size;
3. copy the configs, tokenizer and chat-template files, write ``manifest.json`` last;
4. everything is written into a temporary directory beside the destination, renamed into place
   only at the end; any error removes it.

Output (DESIGN.md "Converted directory layout"): ``params.safetensors`` with flat per-layer names
(``embed``, ``layers.{i}.q``, ..., ``gate.weight``), ``manifest.json`` (format, converter version,
dtype, source files with SHA-256 and sizes), and the copied side files.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import pathlib
import secrets
import shutil
from typing import Callable

from alodlm_convert.checkpoint import DTYPE_LABELS, GATE_FILE, INDEX_FILE, plan_hf_checkpoint
from alodlm_convert.config import CONFIG_FILE, RECURRENCE_FILE
from alodlm_convert.errors import CheckpointError
from alodlm_convert.load import MANIFEST_FILE, MANIFEST_FORMAT, PARAMS_FILE
from alodlm_convert.stream import DEFAULT_BLOCK_BYTES, Progress, write_params

# Side files copied verbatim when present (tokenizer, chat templates, generation config).
SIDE_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "added_tokens.json", "tokenizer.model", "vocab.json", "vocab.txt", "merges.txt")
SIDE_GLOBS = ("*.jinja", "chat_templates/*.jinja")
_HASH_CHUNK = 16 * 1024 * 1024


def converter_version() -> str:
    try:
        return importlib.metadata.version("alodlm-jax")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - source checkout
        return "0.1.0"


def sha256_file(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(_HASH_CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            digest.update(view[:n])
    return digest.hexdigest()


def _side_files(src: pathlib.Path) -> list[pathlib.Path]:
    """Relative paths of the side files present in ``src``."""
    found = [pathlib.Path(n) for n in SIDE_FILES if (src / n).is_file()]
    for pattern in SIDE_GLOBS:
        found.extend(p.relative_to(src) for p in sorted(src.glob(pattern)) if p.is_file())
    return list(dict.fromkeys(found))


def _check_destination(dst: pathlib.Path, src: pathlib.Path) -> None:
    if dst.exists() and not (dst.is_dir() and not any(dst.iterdir())):
        raise CheckpointError(f"output {dst} already exists (choose a new or empty directory)")
    if dst.resolve() == src.resolve() or src.resolve() in dst.resolve().parents:
        raise CheckpointError(f"output {dst} must not be the source directory or inside it")
    if not dst.parent.is_dir():
        raise CheckpointError(f"parent directory of output {dst} does not exist")


def convert_checkpoint(src: str | os.PathLike, dst: str | os.PathLike, dtype: str = "keep",
                       model_config_yaml: str | os.PathLike | None = None,
                       progress: Callable[[Progress], None] | None = None,
                       source_name: str | None = None,
                       block_bytes: int = DEFAULT_BLOCK_BYTES) -> pathlib.Path:
    """Converts the Hugging Face checkpoint directory ``src`` into the params directory ``dst``.

    ``dtype`` is ``"keep"`` (bit-exact), ``"fp32"`` (exact widening) or ``"bf16"``; the gate is
    always fp32. ``source_name`` (e.g. the Hub id) is recorded in the manifest instead of the path.
    ``block_bytes`` bounds how much of one tensor is in memory at a time (large tensors such as
    the embedding and LM head are streamed in row blocks).
    Raises :class:`CheckpointError` (all problems at once) before writing anything.
    """
    src, dst = pathlib.Path(src), pathlib.Path(dst)
    if not src.is_dir():
        raise CheckpointError(f"model directory {src} does not exist")
    _check_destination(dst, src)
    plan = plan_hf_checkpoint(src, dtype, model_config_yaml)
    cfg, target = plan.config, plan.target_dtype

    # The result is an ordinary directory: mode 0o777 less the umask (mkdtemp would make it 0o700).
    tmp = dst.parent / f".{dst.name}.partial-{secrets.token_hex(8)}"
    os.mkdir(tmp, 0o777)
    try:
        label = DTYPE_LABELS[target]
        source_hashes = write_params(plan, tmp / PARAMS_FILE, {"format": MANIFEST_FORMAT, "dtype": label},
                                      block_bytes, progress)
        params_bytes = (tmp / PARAMS_FILE).stat().st_size

        shutil.copyfile(src / CONFIG_FILE, tmp / CONFIG_FILE)
        (tmp / RECURRENCE_FILE).write_text(json.dumps(plan.recurrence, indent=2) + "\n")
        side = _side_files(src)
        for rel in side:
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, tmp / rel)

        hashed = [CONFIG_FILE] + ([RECURRENCE_FILE] if (src / RECURRENCE_FILE).is_file() else [])
        hashed += [INDEX_FILE] if (src / INDEX_FILE).is_file() else []
        hashed += [p.name for p in plan.weight_files] + [GATE_FILE]
        hashed += [str(p) for p in side]
        manifest = {
            "format": MANIFEST_FORMAT,
            "converter_version": converter_version(),
            "dtype": label,
            "requested_dtype": dtype,
            "params": {"name": PARAMS_FILE, "bytes": params_bytes},
            "source": {
                "model": source_name or str(src.resolve()),
                "recurrence_config": str(model_config_yaml) if model_config_yaml else RECURRENCE_FILE,
                "files": [{"name": n, "sha256": source_hashes.get(n) or sha256_file(src / n),
                           "bytes": (src / n).stat().st_size} for n in hashed],
            },
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
        if dst.exists():
            dst.rmdir()  # empty (checked above); rename needs the name free
        os.replace(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst
