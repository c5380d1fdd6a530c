"""A restricted reader for tensor state dicts saved with ``torch.save`` — without torch.

``torch.save`` (zip serialization, the default since PyTorch 1.6) writes a zip archive with one
top-level folder (named after the file stem, e.g. ``exit_gate/``) holding ``data.pkl`` (the
pickled object graph), ``data/<key>`` (raw little-endian storage bytes), ``byteorder`` and
``version``. Tensors appear in the pickle as ``torch._utils._rebuild_tensor_v2(storage, offset,
size, stride, requires_grad, hooks)`` where ``storage`` is a persistent id
``("storage", torch.<Type>Storage, key, location, numel)``.

Pickle can call any importable function, so a checkpoint from the internet is code. This reader
resolves only the handful of globals a tensor state dict needs, to local stand-ins, and refuses
every other global with an error naming the file and the global; nothing from torch (or anything
else) is ever imported or called. This is the equivalent of ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import math
import os
import pathlib
import pickle
import zipfile
from typing import Any

import ml_dtypes
import numpy as np

from alodlm_convert.errors import CheckpointError

_STORAGE_DTYPES = {
    "FloatStorage": np.dtype("<f4"),
    "DoubleStorage": np.dtype("<f8"),
    "HalfStorage": np.dtype("<f2"),
    "BFloat16Storage": np.dtype(ml_dtypes.bfloat16),
    "LongStorage": np.dtype("<i8"),
    "IntStorage": np.dtype("<i4"),
    "ShortStorage": np.dtype("<i2"),
    "CharStorage": np.dtype("i1"),
    "ByteStorage": np.dtype("u1"),
    "BoolStorage": np.dtype("bool"),
}
_TORCH_DTYPES = {
    "float32": np.dtype("<f4"),
    "float": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "double": np.dtype("<f8"),
    "float16": np.dtype("<f2"),
    "half": np.dtype("<f2"),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "int64": np.dtype("<i8"),
    "int32": np.dtype("<i4"),
    "int16": np.dtype("<i2"),
    "int8": np.dtype("i1"),
    "uint8": np.dtype("u1"),
    "bool": np.dtype("bool"),
}


# Bounds on what is decompressed, so a crafted archive cannot balloon memory.
_MAX_PICKLE_BYTES = 64 * 1024 * 1024
_STORAGE_SLACK = 4096


@dataclasses.dataclass(frozen=True)
class _StorageType:
    """Stand-in for ``torch.<Type>Storage`` (an instance, so pickle cannot instantiate it)."""

    dtype: np.dtype


@dataclasses.dataclass(frozen=True)
class _TorchDtype:
    """Stand-in for a ``torch.<dtype>`` global."""

    dtype: np.dtype


@dataclasses.dataclass(frozen=True)
class _Storage:
    """A storage's elements as a 1-D numpy array."""

    data: np.ndarray


class _RebuildTensor:
    """Stand-in for ``torch._utils._rebuild_tensor_v2``: a bounds-checked strided view, copied."""

    def __init__(self, path: pathlib.Path):
        self.path = path

    def __call__(self, storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None,
                 metadata=None):
        where = str(self.path)
        if not isinstance(storage, _Storage):
            raise CheckpointError("tensor rebuilt from something that is not a storage record", where=where)
        ints = lambda xs: isinstance(xs, tuple) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                        for x in xs)
        if not (isinstance(storage_offset, int) and storage_offset >= 0 and ints(size) and ints(stride)
                and len(size) == len(stride)):
            raise CheckpointError(f"malformed tensor record (offset {storage_offset!r}, size {size!r}, "
                                  f"stride {stride!r})", where=where)
        data = storage.data
        if math.prod(size) == 0:
            return np.empty(size, dtype=data.dtype)
        last = storage_offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= data.size:
            raise CheckpointError(f"tensor of size {list(size)} (offset {storage_offset}, stride {list(stride)}) "
                                  f"reaches element {last} of a {data.size}-element storage", where=where)
        item = data.itemsize
        view = np.lib.stride_tricks.as_strided(data[storage_offset:], shape=size,
                                               strides=tuple(s * item for s in stride), writeable=False)
        return np.array(view, copy=True, order="C")


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves only the globals of a tensor state dict; storages come from the zip entries."""

    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str, path: pathlib.Path):
        super().__init__(io.BytesIO(data))
        self._archive = archive
        self._prefix = prefix
        self._path = path
        self._storages: dict[str, _Storage] = {}
        self._rebuild = _RebuildTensor(path)

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return self._rebuild
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(_STORAGE_DTYPES[name])
        if module == "torch" and name in _TORCH_DTYPES:
            return _TorchDtype(_TORCH_DTYPES[name])
        raise CheckpointError(f"refusing to load global '{module}.{name}': only tensor state dicts are "
                              f"allowed (the file may be malicious or not a state dict)", where=str(self._path))

    def persistent_load(self, pid: Any) -> _Storage:
        where = str(self._path)
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise CheckpointError(f"unsupported persistent record {pid!r:.80}", where=where)
        _, kind, key, _location, numel = pid
        if isinstance(kind, _StorageType):
            dtype = kind.dtype
        elif isinstance(kind, _TorchDtype):
            dtype = kind.dtype
        else:
            raise CheckpointError(f"storage record with unknown type {kind!r:.80}", where=where)
        if not isinstance(key, str) or not isinstance(numel, int) or numel < 0:
            raise CheckpointError(f"malformed storage record {pid!r:.80}", where=where)
        cached = self._storages.get(key)
        if cached is not None:
            if cached.data.dtype != dtype:
                raise CheckpointError(f"storage {key!r} used with two dtypes", where=where)
            return cached
        entry = f"{self._prefix}data/{key}"
        needed = numel * dtype.itemsize
        try:
            info = self._archive.getinfo(entry)
        except KeyError:
            raise CheckpointError(f"missing storage entry {entry!r}", where=where) from None
        if info.file_size > needed + _STORAGE_SLACK:  # never inflate more than the record needs
            raise CheckpointError(f"storage entry {entry!r} holds {info.file_size} bytes, the record "
                                  f"needs {needed}", where=where)
        raw = self._archive.read(info)
        if len(raw) < needed:
            raise CheckpointError(f"storage entry {entry!r} has {len(raw)} bytes, {numel} x {dtype} needs "
                                  f"{numel * dtype.itemsize} (truncated?)", where=where)
        storage = _Storage(np.frombuffer(raw, dtype=dtype, count=numel))
        self._storages[key] = storage
        return storage


def _archive_prefix(archive: zipfile.ZipFile, path: pathlib.Path) -> str:
    pickles = [n for n in archive.namelist() if n.endswith("data.pkl") and n.count("/") <= 1]
    if len(pickles) != 1:
        raise CheckpointError(f"expected exactly one data.pkl in the archive, found {len(pickles)}",
                              where=str(path))
    return pickles[0][: -len("data.pkl")]


def read_state_dict(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Reads a ``torch.save``'d dict of tensors into numpy arrays (bit-exact, own copies).

    Raises :class:`CheckpointError` for anything else: a legacy (non-zip) file, a pickle that
    references a global outside the allow-list, a big-endian archive, a non-tensor value.
    """
    path = pathlib.Path(path)
    where = str(path)
    if not path.is_file():
        raise CheckpointError("file does not exist", where=where)
    if not zipfile.is_zipfile(path):
        raise CheckpointError("not a zip-format torch.save file (legacy or corrupt pickle files are "
                              "not supported)", where=where)
    try:
        with zipfile.ZipFile(path) as archive:
            prefix = _archive_prefix(archive, path)
            names = set(archive.namelist())
            if f"{prefix}byteorder" in names:
                order = archive.read(f"{prefix}byteorder").decode("ascii", "replace").strip()
                if order != "little":
                    raise CheckpointError(f"byteorder {order!r} is not supported (little-endian only)",
                                          where=where)
            pkl = archive.getinfo(f"{prefix}data.pkl")
            if pkl.file_size > _MAX_PICKLE_BYTES:
                raise CheckpointError(f"data.pkl is {pkl.file_size} bytes; a tensor state dict's is tiny",
                                      where=where)
            unpickler = _RestrictedUnpickler(archive.read(pkl), archive, prefix, path)
            obj = unpickler.load()
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError) as exc:
        raise CheckpointError(f"corrupt torch.save file ({type(exc).__name__}: {exc})", where=where) from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"expected a dict of tensors, got {type(obj).__name__}", where=where)
    bad = [k for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, np.ndarray)]
    if bad:
        raise CheckpointError(f"entries that are not named tensors: {bad[:5]!r}", where=where)
    return dict(obj)
