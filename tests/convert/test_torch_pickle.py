"""The restricted torch.save reader: bit-exact tensors, no torch import, hostile pickles refused."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import zipfile

import ml_dtypes
import numpy as np
import pytest

from alodlm_convert.errors import CheckpointError
from alodlm_convert.torch_pickle import read_state_dict

torch = pytest.importorskip("torch")


def _bytes(a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _torch_bytes(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return _bytes(t.numpy())


@pytest.mark.parametrize("dtype, np_dtype", [(torch.float32, np.float32), (torch.bfloat16, ml_dtypes.bfloat16),
                                             (torch.float16, np.float16)])
def test_bit_exact_against_torch(tmp_path, dtype, np_dtype):
    g = torch.Generator().manual_seed(3)
    state = {"net.weight": torch.randn(1, 37, generator=g).to(dtype),
             "net.bias": torch.tensor([-0.25]).to(dtype),
             "depth_bias": torch.tensor([-0.7, 0.2, 0.8, 0.0]).to(dtype),
             "scalar": torch.tensor(3.0).to(dtype),
             "special": torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0]).to(dtype)}
    path = tmp_path / "gate.pt"
    torch.save(state, path)
    got = read_state_dict(path)
    assert list(got) == list(state)
    for key, t in state.items():
        assert got[key].dtype == np.dtype(np_dtype) and got[key].shape == tuple(t.shape)
        assert np.array_equal(_bytes(got[key]), _torch_bytes(t)), key


def test_views_offsets_strides_and_shared_storage(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = {"transposed": base.t(), "row": base[2], "column": base[:, 3], "slice": base[1:3, 2:5],
             "whole": base, "int": torch.arange(5), "empty": torch.zeros(0, 4)}
    path = tmp_path / "views.pt"
    torch.save(state, path)
    got = read_state_dict(path)
    for key, t in state.items():
        assert np.array_equal(got[key], t.numpy()), key
        assert got[key].flags.c_contiguous and got[key].flags.owndata
    got["row"][0] = -1  # copies, not views of a shared buffer
    assert got["whole"][2, 0] == 12


def test_no_torch_import(tmp_path):
    path = tmp_path / "g.pt"
    torch.save({"w": torch.ones(3)}, path)
    code = ("import sys; from alodlm_convert.torch_pickle import read_state_dict; "
            f"print(read_state_dict({str(path)!r})['w'].sum()); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["3.0", "False"]


class _Evil:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def _zip_with_pickle(path, payload: bytes, prefix="archive/"):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(prefix + "data.pkl", payload)
        z.writestr(prefix + "byteorder", "little")
        z.writestr(prefix + "version", "3\n")


def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "exit_gate.pt"
    _zip_with_pickle(path, pickle.dumps({"net.weight": _Evil(f"touch {marker}")}, protocol=2))
    with pytest.raises(CheckpointError) as info:
        read_state_dict(path)
    msg = str(info.value)
    assert str(path) in msg and "system" in msg and "refusing to load global" in msg
    assert not marker.exists()
    # Sanity: the payload really would have run under plain pickle.
    with zipfile.ZipFile(path) as z:
        pickle.loads(z.read("archive/data.pkl"))
    assert marker.exists()


@pytest.mark.parametrize("module, name", [("builtins", "eval"), ("torch", "load"),
                                          ("torch.nn.modules.linear", "Linear"), ("numpy", "frombuffer")])
def test_other_globals_refused(tmp_path, module, name):
    payload = b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"q\x00."
    path = tmp_path / "x.pt"
    _zip_with_pickle(path, payload)
    with pytest.raises(CheckpointError, match=f"'{module}.{name}'"):
        read_state_dict(path)


def test_saved_module_and_non_tensor_values_refused(tmp_path):
    torch.save(torch.nn.Linear(2, 1), tmp_path / "module.pt")
    with pytest.raises(CheckpointError, match="refusing to load global"):
        read_state_dict(tmp_path / "module.pt")
    torch.save({"w": torch.ones(1), "step": 3}, tmp_path / "mixed.pt")
    with pytest.raises(CheckpointError, match="not named tensors"):
        read_state_dict(tmp_path / "mixed.pt")


def test_legacy_missing_and_corrupt_files(tmp_path):
    torch.save({"w": torch.ones(2)}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match="not a zip-format"):
        read_state_dict(tmp_path / "legacy.pt")
    with pytest.raises(CheckpointError, match="does not exist"):
        read_state_dict(tmp_path / "absent.pt")
    torch.save({"w": torch.ones(64)}, tmp_path / "good.pt")
    with zipfile.ZipFile(tmp_path / "good.pt") as src, zipfile.ZipFile(tmp_path / "cut.pt", "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            dst.writestr(item, data[:10] if item.filename.endswith("data/0") else data)
    with pytest.raises(CheckpointError, match="truncated"):
        read_state_dict(tmp_path / "cut.pt")


def _crafted_tensor_pickle(numel, offset, size, stride) -> bytes:
    """A protocol-2 pickle of {"w": tensor} using only allowed globals, with chosen geometry."""
    i = lambda n: b"J" + int(n).to_bytes(4, "little", signed=True)
    s = lambda text: b"X" + len(text).to_bytes(4, "little") + text.encode()
    tup = lambda xs: b"(" + b"".join(i(x) for x in xs) + b"t"
    return (b"\x80\x02}" + s("w") + b"ctorch._utils\n_rebuild_tensor_v2\n(" +
            b"(" + s("storage") + b"ctorch\nFloatStorage\n" + s("0") + s("cpu") + i(numel) + b"tQ" +
            i(offset) + tup(size) + tup(stride) + b"\x89ccollections\nOrderedDict\n)RtRs.")


def _crafted_file(path, numel, offset, size, stride):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", _crafted_tensor_pickle(numel, offset, size, stride))
        z.writestr("archive/data/0", np.arange(numel, dtype=np.float32).tobytes())
        z.writestr("archive/byteorder", "little")
    return path


def test_crafted_geometry_is_bounds_checked(tmp_path):
    ok = read_state_dict(_crafted_file(tmp_path / "ok.pt", 12, 2, (2, 3), (1, 2)))
    assert np.array_equal(ok["w"], np.arange(12, dtype=np.float32)[2:].reshape(5, 2)[:3].T)
    for name, geometry in {"past_end": (12, 0, (4, 4), (4, 1)), "offset": (12, 11, (2,), (1,)),
                           "stride": (12, 0, (2, 2), (100, 1))}.items():
        with pytest.raises(CheckpointError, match="reaches element"):
            read_state_dict(_crafted_file(tmp_path / f"{name}.pt", *geometry))
    with pytest.raises(CheckpointError, match="malformed tensor record"):
        read_state_dict(_crafted_file(tmp_path / "neg.pt", 12, 0, (2,), (-1,)))


def test_oversized_storage_entry_is_not_inflated(tmp_path):
    path = tmp_path / "bomb.pt"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", _crafted_tensor_pickle(4, 0, (4,), (1,)))
        z.writestr("archive/data/0", b"\0" * (8 << 20))
    with pytest.raises(CheckpointError, match="the record needs 16"):
        read_state_dict(path)
