"""Our safetensors reader/writer against the reference library, and corrupt-file errors."""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch

from alodlm_convert.errors import CheckpointError
from alodlm_convert.safetensors_io import SafetensorsFile, write_safetensors

torch = pytest.importorskip("torch")


def _sample_torch():
    g = torch.Generator().manual_seed(0)
    return {
        "a.f32": torch.randn(3, 5, generator=g),
        "b.bf16": torch.randn(7, 2, generator=g).to(torch.bfloat16),
        "c.f16": torch.randn(4, generator=g).to(torch.float16),
        "d.scalar": torch.tensor(1.5),
        "e.empty": torch.zeros(0, 3),
        "f.i64": torch.arange(6).reshape(2, 3),
    }


def _bytes(a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def test_reader_matches_library_on_real_files(tmp_path):
    tensors = _sample_torch()
    path = tmp_path / "t.safetensors"
    safetensors.torch.save_file(tensors, path, metadata={"format": "pt"})
    f = SafetensorsFile(path)
    assert f.metadata == {"format": "pt"}
    assert set(f.tensors) == set(tensors)
    for name, t in tensors.items():
        got = f.read(name)
        assert got.shape == tuple(t.shape)
        if t.dtype == torch.bfloat16:
            assert got.dtype == np.dtype(ml_dtypes.bfloat16)
            want = t.view(torch.int16).numpy()
        else:
            want = t.numpy()
        assert np.array_equal(_bytes(got), _bytes(want)), name


def test_writer_output_is_read_by_library(tmp_path):
    rng = np.random.default_rng(1)
    arrays = {"x": rng.standard_normal((4, 6)).astype(np.float32),
              "h": rng.standard_normal(9).astype(np.float16),
              "s": np.array(2.5, np.float32),
              "t": rng.standard_normal((6, 4)).astype(np.float32).T}  # non-contiguous input
    path = tmp_path / "ours.safetensors"
    write_safetensors(path, arrays, metadata={"k": "v"})
    back = safetensors.numpy.load_file(path)
    for name, a in arrays.items():
        assert np.array_equal(back[name], a) and back[name].dtype == a.dtype
    bf = {"w": rng.standard_normal((3, 3)).astype(ml_dtypes.bfloat16)}
    write_safetensors(tmp_path / "bf.safetensors", bf)
    t = safetensors.torch.load_file(tmp_path / "bf.safetensors")["w"]
    assert np.array_equal(t.view(torch.int16).numpy().view(np.uint8), bf["w"].view(np.uint8))
    assert (tmp_path / "ours.safetensors").read_bytes()[:8] != b"\0" * 8
    assert int.from_bytes((tmp_path / "ours.safetensors").read_bytes()[:8], "little") % 8 == 0


def _raw_file(path, header: dict | bytes, data: bytes, header_len: int | None = None):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if header_len is None else header_len) + raw + data)
    return path


def _error(path) -> str:
    with pytest.raises(CheckpointError) as info:
        SafetensorsFile(path)
    msg = str(info.value)
    assert str(path) in msg and "\n" not in msg
    return msg


def test_truncated_and_corrupt_files(tmp_path):
    good = tmp_path / "good.safetensors"
    write_safetensors(good, {"w": np.arange(8, dtype=np.float32)})
    raw = good.read_bytes()
    (tmp_path / "short.safetensors").write_bytes(raw[:5])
    assert "too short" in _error(tmp_path / "short.safetensors")
    (tmp_path / "cut.safetensors").write_bytes(raw[:-4])
    assert "tensor 'w'" in _error(tmp_path / "cut.safetensors")
    assert "runs past the end" in _error(_raw_file(tmp_path / "hl.safetensors", {}, b"", header_len=500))
    assert "not valid JSON" in _error(_raw_file(tmp_path / "json.safetensors", b"{not json", b""))
    entry = lambda off, shape=(2,): {"dtype": "F32", "shape": list(shape), "data_offsets": off}
    assert "beyond" in _error(_raw_file(tmp_path / "beyond.safetensors", {"w": entry([0, 16], (4,))}, b"\0" * 8))
    assert "overlap" in _error(_raw_file(tmp_path / "overlap.safetensors",
                                         {"a": entry([0, 8]), "b": entry([4, 12])}, b"\0" * 12))
    assert "gap" in _error(_raw_file(tmp_path / "gap.safetensors", {"a": entry([4, 12])}, b"\0" * 12))
    assert "needs 8" in _error(_raw_file(tmp_path / "size.safetensors", {"a": entry([0, 12])}, b"\0" * 12))
    assert "unsupported dtype 'Q7'" in _error(_raw_file(
        tmp_path / "dtype.safetensors", {"a": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8))
    assert "trailing bytes" in _error(_raw_file(tmp_path / "trail.safetensors", {"a": entry([0, 8])}, b"\0" * 12))


def test_several_header_problems_together(tmp_path):
    entry = lambda off, shape, dt="F32": {"dtype": dt, "shape": shape, "data_offsets": off}
    path = _raw_file(tmp_path / "many.safetensors",
                     {"a": entry([0, 8], [3]), "b": entry([8, 16], [2], "X9"), "c": entry([16, 99], [2])},
                     b"\0" * 16)
    with pytest.raises(CheckpointError) as info:
        SafetensorsFile(path)
    names = " ".join(info.value.problems)
    assert "'a'" in names and "'b'" in names and "'c'" in names


def test_file_shrunk_after_header_check(tmp_path):
    path = tmp_path / "w.safetensors"
    write_safetensors(path, {"w": np.arange(1024, dtype=np.float32)})
    f = SafetensorsFile(path)
    with open(path, "r+b") as h:
        h.truncate(path.stat().st_size - 100)
    with pytest.raises(CheckpointError, match="truncated"):
        f.read("w")
