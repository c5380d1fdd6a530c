"""A small streaming reader and writer for the safetensors format.

Format: 8-byte little-endian header length ``n``, ``n`` bytes of JSON (``{name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {str: str}}``, offsets relative to the end of the
header), then the raw little-endian tensor bytes.

Why our own: conversion must touch one tensor at a time (peak memory about one tensor beyond the
output), must check a whole checkpoint from its headers before reading any data, and must give
errors that name the file and the tensor when a download is truncated or corrupt. Reading copies a
tensor's bytes straight from the file into a fresh array with ``readinto`` (no mmap, so the page
cache is not charged to the process), and the writer streams tensors in header order.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from typing import Any, Callable, Iterable, Mapping

import ml_dtypes
import numpy as np

from alodlm_convert.errors import CheckpointError

# safetensors dtype names -> numpy dtypes (little-endian; bfloat16/float8 from ml_dtypes).
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("bool"),
}
_NAMES_BY_DTYPE = {dt: name for name, dt in DTYPES.items()}
# Refuse absurd header lengths before allocating (the reference library uses 100 MB too).
MAX_HEADER_BYTES = 100 * 1024 * 1024
_HEADER_ALIGN = 8
_COPY_CHUNK = 64 * 1024 * 1024


def dtype_name(dtype: np.dtype | type) -> str:
    """The safetensors name of a numpy dtype (``float32`` -> ``"F32"``)."""
    dt = np.dtype(dtype).newbyteorder("<") if np.dtype(dtype).byteorder == ">" else np.dtype(dtype)
    try:
        return _NAMES_BY_DTYPE[dt]
    except KeyError:
        raise ValueError(f"dtype {dt} has no safetensors name") from None


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One header entry; ``start``/``end`` are absolute byte offsets into the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def np_dtype(self) -> np.dtype:
        return DTYPES[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.end - self.start


class SafetensorsFile:
    """The validated header of one safetensors file, and tensor-by-tensor reads.

    Opening reads only the header; every structural problem (truncation, bad JSON, offsets beyond
    the file, overlaps, holes, size/shape mismatches, unknown dtypes) is reported together in one
    :class:`CheckpointError` naming the file and the tensors.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        self.metadata: dict[str, str] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._parse_header()

    def __repr__(self) -> str:
        return f"SafetensorsFile({str(self.path)!r}, {len(self.tensors)} tensors)"

    def _fail(self, problems: list[str] | str) -> None:
        raise CheckpointError(problems, where=str(self.path))

    def _parse_header(self) -> None:
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    self._fail(f"truncated: {size} bytes, too short for the 8-byte header length")
                header_len = int.from_bytes(head, "little")
                if header_len > MAX_HEADER_BYTES:
                    self._fail(f"header length {header_len} exceeds the {MAX_HEADER_BYTES}-byte limit "
                               f"(not a safetensors file?)")
                if 8 + header_len > size:
                    self._fail(f"truncated: header length {header_len} runs past the end of the "
                               f"{size}-byte file")
                raw = f.read(header_len)
        except OSError as exc:
            raise CheckpointError(f"cannot read: {exc.strerror or exc}", where=str(self.path)) from None
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            self._fail(f"corrupt header: not valid JSON ({exc})")
        if not isinstance(header, dict):
            self._fail("corrupt header: the JSON header must be an object")
        self.data_start = 8 + header_len
        data_size = size - self.data_start
        problems: list[str] = []
        meta = header.pop("__metadata__", None)
        if meta is not None:
            if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
                problems.append("__metadata__: must map strings to strings")
            else:
                self.metadata = dict(meta)
        spans: list[tuple[int, int, str]] = []
        for name, entry in header.items():
            info = self._parse_entry(name, entry, data_size, problems)
            if info is not None:
                self.tensors[name] = info
                spans.append((info.start - self.data_start, info.end - self.data_start, name))
        spans.sort()
        covered = 0
        for begin, end, name in spans:
            if begin < covered:
                problems.append(f"tensor {name!r}: data_offsets [{begin}, {end}] overlap the previous tensor")
            elif begin > covered and end > begin:
                problems.append(f"tensor {name!r}: gap of {begin - covered} bytes before its data "
                                f"(misaligned data_offsets)")
            covered = max(covered, end)
        if spans and covered < data_size:
            problems.append(f"{data_size - covered} trailing bytes after the last tensor")
        if problems:
            self._fail(problems)

    def _parse_entry(self, name: str, entry: Any, data_size: int, problems: list[str]) -> TensorInfo | None:
        if not isinstance(entry, dict):
            problems.append(f"tensor {name!r}: header entry must be an object")
            return None
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        bad = False
        if dtype not in DTYPES:
            problems.append(f"tensor {name!r}: unsupported dtype {dtype!r}")
            bad = True
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):
            problems.append(f"tensor {name!r}: shape must be a list of non-negative integers, got {shape!r}")
            bad = True
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            problems.append(f"tensor {name!r}: data_offsets must be [begin, end] with 0 <= begin <= end, "
                            f"got {offsets!r}")
            return None
        if offsets[1] > data_size:
            problems.append(f"tensor {name!r}: data_offsets end {offsets[1]} is beyond the "
                            f"{data_size} data bytes in the file (truncated?)")
            bad = True
        if not bad:
            expected = math.prod(shape) * DTYPES[dtype].itemsize
            if offsets[1] - offsets[0] != expected:
                problems.append(f"tensor {name!r}: data_offsets span {offsets[1] - offsets[0]} bytes, "
                                f"but {dtype} {shape} needs {expected}")
                bad = True
        if bad:
            return None
        return TensorInfo(name, dtype, tuple(shape), self.data_start + offsets[0], self.data_start + offsets[1])

    def read(self, name: str) -> np.ndarray:
        """Reads one tensor into a new C-contiguous array (exactly one copy of its bytes)."""
        info = self.tensors.get(name)
        if info is None:
            raise CheckpointError(f"no tensor named {name!r}", where=str(self.path))
        out = np.empty(info.shape, dtype=info.np_dtype)
        self.read_into(name, out)
        return out

    def read_into(self, name: str, out: np.ndarray) -> None:
        """Reads one tensor's bytes directly into ``out`` (C-contiguous, same dtype and size)."""
        info = self.tensors[name]
        if out.dtype != info.np_dtype or out.size != math.prod(info.shape) or not out.flags.c_contiguous:
            raise ValueError(f"{self.path}: tensor {name!r}: destination {out.dtype}{out.shape} does not "
                             f"match {info.dtype}{list(info.shape)}")
        buf = memoryview(out.reshape(-1).view(np.uint8))
        with open(self.path, "rb", buffering=0) as f:
            f.seek(info.start)
            done = 0
            while done < info.nbytes:
                n = f.readinto(buf[done:done + _COPY_CHUNK])
                if not n:
                    raise CheckpointError(f"tensor {name!r}: file ended after {done} of {info.nbytes} bytes "
                                          f"(truncated)", where=str(self.path))
                done += n


def read_exact(f, view: memoryview, path: pathlib.Path, what: str) -> None:
    """Fills ``view`` from the unbuffered file ``f`` at its position (CheckpointError naming the
    file and ``what`` when the file ends first: a truncated download)."""
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            raise CheckpointError(f"{what}: file ended after {done} of {len(view)} bytes (truncated)",
                                  where=str(path))
        done += n


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """What the writer must know about a tensor before any data is written."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


def build_header(specs: Iterable[TensorSpec], metadata: Mapping[str, str] | None = None) -> bytes:
    """The length-prefixed JSON header (padded with spaces to 8 bytes) for tensors in this order."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for spec in specs:
        if spec.name in header:
            raise ValueError(f"duplicate tensor name {spec.name!r}")
        header[spec.name] = {"dtype": dtype_name(spec.dtype), "shape": list(spec.shape),
                             "data_offsets": [offset, offset + spec.nbytes]}
        offset += spec.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-(8 + len(raw)) % _HEADER_ALIGN)
    return len(raw).to_bytes(8, "little") + raw


class SafetensorsWriter:
    """Streams tensors into a safetensors file: header first, then each tensor in declared order.

    Use as a context manager; leaving the block without having written every declared tensor
    raises (the caller deletes the partial file).
    """

    def __init__(self, path: str | os.PathLike, specs: Iterable[TensorSpec],
                 metadata: Mapping[str, str] | None = None,
                 on_bytes: Callable[[memoryview | bytes], object] | None = None):
        self.path = pathlib.Path(path)
        self.specs = list(specs)
        self._next = 0
        self._on_bytes = on_bytes
        self._file = open(self.path, "wb")
        self._emit(build_header(self.specs, metadata))

    def _emit(self, data: memoryview | bytes) -> None:
        """Writes bytes (and hands them to ``on_bytes``, e.g. a running SHA-256)."""
        self._file.write(data)
        if self._on_bytes is not None:
            self._on_bytes(data)

    def write(self, name: str, array: np.ndarray) -> None:
        if self._next >= len(self.specs):
            raise ValueError(f"{self.path}: unexpected extra tensor {name!r}")
        spec = self.specs[self._next]
        if name != spec.name or array.dtype != np.dtype(spec.dtype) or tuple(array.shape) != spec.shape:
            raise ValueError(f"{self.path}: expected tensor {spec.name!r} {np.dtype(spec.dtype)}{list(spec.shape)}, "
                             f"got {name!r} {array.dtype}{list(array.shape)}")
        array = np.ascontiguousarray(array)
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        self._emit(memoryview(array.reshape(-1).view(np.uint8)))
        self._next += 1

    def close(self) -> None:
        if self._file.closed:
            return
        self._file.close()
        if self._next != len(self.specs):
            missing = [s.name for s in self.specs[self._next:]]
            raise ValueError(f"{self.path}: closed before writing {len(missing)} tensor(s): {missing[:5]}")

    def __enter__(self) -> "SafetensorsWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._file.close()
            return
        self.close()


def write_safetensors(path: str | os.PathLike, tensors: Mapping[str, np.ndarray],
                      metadata: Mapping[str, str] | None = None) -> None:
    """Writes a dict of arrays (convenience for small files and tests)."""
    specs = [TensorSpec(name, a.dtype, tuple(a.shape)) for name, a in tensors.items()]
    with SafetensorsWriter(path, specs, metadata) as writer:
        for name, a in tensors.items():
            writer.write(name, a)
