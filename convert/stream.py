"""Stream a validated checkpoint into ``params.safetensors`` with bounded memory.

Three stages run concurrently on fixed buffers:

* the main thread reads a block of source rows, and transposes/casts it into an output buffer;
* a hasher thread computes each source file's SHA-256 from the very bytes being converted
  (each file is read front to back — header, then tensors in offset order — so no second pass);
* a writer thread puts output blocks at their final offsets with ``os.pwrite``.

hashlib and ``os.pwrite`` release the GIL, so the stages overlap. Buffers come from two small
pools and go back when their consumer is done, so memory stays at a few blocks however large the
model is, and no block allocation hits fresh pages (which is slow on virtual machines that hand
freed memory back to the host).

A transposed tensor ``[R, C]`` becomes ``[C, R]``: source rows ``r0:r1`` are output columns
``r0:r1``, written as ``C`` row segments, which is how the 622 MB embedding-sized LM head is
converted without ever holding it whole.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import queue
import threading
import time
from typing import Callable

import numpy as np

from alodlm_convert.checkpoint import CheckpointPlan, PlannedTensor
from alodlm_convert.mapping import GATE_KEYS, converted_gate_shapes, gate_to_ours
from alodlm_convert.safetensors_io import TensorSpec, build_header, read_exact
from alodlm_convert.transforms import cast, transpose_into, transposed

DEFAULT_BLOCK_BYTES = 32 * 1024 * 1024
_POOL_SIZE = 3


@dataclasses.dataclass(frozen=True)
class Progress:
    """One progress report: tensor ``index`` of ``count`` done, bytes read so far, elapsed time."""

    index: int
    count: int
    name: str
    bytes_done: int
    bytes_total: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.bytes_done / 1e6 / self.seconds if self.seconds > 0 else 0.0


class _Worker:
    """One background thread running submitted callables in order; a bounded queue gives
    back-pressure. The first exception is re-raised on the next submit or at close."""

    def __init__(self, name: str, depth: int = 2):
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                if self._error is None:
                    job()
            except BaseException as exc:  # re-raised on the main thread
                self._error = exc
            finally:
                self._queue.task_done()

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    def submit(self, job: Callable[[], object]) -> None:
        self._check()
        self._queue.put(job)

    def drain(self) -> None:
        self._queue.join()
        self._check()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._check()


class _Pool:
    """A fixed set of equal byte buffers, handed out and given back (blocking when empty)."""

    def __init__(self, nbytes: int, count: int):
        self._free: queue.Queue = queue.Queue()
        for _ in range(count):
            self._free.put(np.empty(nbytes, np.uint8))

    def get(self) -> np.ndarray:
        return self._free.get()

    def put(self, buf: np.ndarray) -> None:
        self._free.put(buf)


def _pwrite_all(fd: int, data, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _preallocate(fd: int, size: int) -> None:
    """Reserves the whole file up front: on ext4 this makes the positioned writes several times
    faster than growing a sparse file. Falls back to a sparse file where unsupported."""
    try:
        os.posix_fallocate(fd, 0, size)
    except (OSError, AttributeError):
        os.ftruncate(fd, size)


def _as_bytes(a: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8))


class _ParamsStreamer:
    def __init__(self, fd: int, target: np.dtype, block_bytes: int, max_row_bytes: int, min_src_item: int):
        self.fd = fd
        self.target = target
        # Whole rows per block: a block is at least one source row, however wide.
        self.block_bytes = max(block_bytes, max_row_bytes)
        widen = -(-target.itemsize // min_src_item)  # bf16 -> fp32 doubles a block
        self.raw_pool = _Pool(self.block_bytes, _POOL_SIZE)
        self.out_pool = _Pool(self.block_bytes * widen, _POOL_SIZE)
        self.hasher = _Worker("sha256")
        self.writer = _Worker("params-writer")

    def hash(self, digest, data: memoryview, release: Callable[[], None] | None = None) -> None:
        def job():
            digest.update(data)
            if release is not None:
                release()

        self.hasher.submit(job)

    def write(self, pieces: list[tuple[memoryview, int]], release: Callable[[], None] | None = None) -> None:
        fd = self.fd

        def job():
            for data, offset in pieces:
                _pwrite_all(fd, data, offset)
            if release is not None:
                release()

        self.writer.submit(job)

    def tensor(self, f, t: PlannedTensor, base: int, digest) -> None:
        src_dtype, shape, target = t.info.np_dtype, t.entry.hf_shape, self.target
        rows = shape[0]
        cols = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
        row_bytes = cols * src_dtype.itemsize
        rows_per_block = max(1, self.block_bytes // max(1, row_bytes))
        out_item = target.itemsize
        f.seek(t.info.start)
        for r0 in range(0, rows, rows_per_block):
            rb = min(rows_per_block, rows - r0)
            raw = self.raw_pool.get()
            raw_view = memoryview(raw)[: rb * row_bytes]
            read_exact(f, raw_view, t.file.path, f"tensor {t.info.name!r}")
            self.hash(digest, raw_view, release=lambda raw=raw: self.raw_pool.put(raw))
            block = raw[: rb * row_bytes].view(src_dtype).reshape(rb, cols)
            out = self.out_pool.get()
            release = lambda out=out: self.out_pool.put(out)
            if t.entry.transform == "copy":
                dst = out[: rb * cols * out_item].view(target).reshape(rb, cols)
                np.copyto(dst, cast(block, target))
                self.write([(_as_bytes(dst), base + r0 * cols * out_item)], release)
                continue
            dst = out[: rb * cols * out_item].view(target).reshape(cols, rb)
            if src_dtype == target:
                transpose_into(dst, block)
            elif src_dtype.itemsize > out_item:
                transpose_into(dst, cast(block, target))
            else:
                np.copyto(dst, cast(transposed(block), target))
            if rb == rows:
                self.write([(_as_bytes(dst), base)], release)
            else:
                self.write([(memoryview(dst[c].view(np.uint8)), base + (c * rows + r0) * out_item)
                            for c in range(cols)], release)

    def close(self) -> None:
        errors = []
        for worker in (self.hasher, self.writer):
            try:
                worker.close()
            except BaseException as exc:
                errors.append(exc)
        if errors:
            raise errors[0]


def write_params(plan: CheckpointPlan, path: pathlib.Path, metadata: dict[str, str],
                 block_bytes: int = DEFAULT_BLOCK_BYTES,
                 progress: Callable[[Progress], None] | None = None) -> dict[str, str]:
    """Streams every tensor of ``plan`` into ``path``; returns the SHA-256 of each source file
    that was read completely (all of them for a valid checkpoint).

    The output lists tensors in the canonical order (embed, layers, final_norm, lm_head, gate).
    """
    cfg, target = plan.config, plan.target_dtype
    specs = [TensorSpec(t.entry.name, target, t.entry.shape) for t in plan.tensors]
    specs += [TensorSpec(f"gate.{k}", np.dtype(np.float32), s) for k, s in converted_gate_shapes(cfg).items()]
    header = build_header(specs, metadata)
    offsets, end = {}, len(header)
    for spec in specs:
        offsets[spec.name] = end
        end += spec.nbytes
    max_row = max((int(np.prod(t.entry.hf_shape[1:], dtype=np.int64)) * t.info.np_dtype.itemsize
                   for t in plan.tensors), default=1)
    total, done, start = plan.total_bytes, 0, time.perf_counter()
    hashes: dict[str, str] = {}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    streamer = None
    try:
        _pwrite_all(fd, header, 0)
        _preallocate(fd, end)
        min_item = min((t.info.np_dtype.itemsize for t in plan.tensors), default=1)
        streamer = _ParamsStreamer(fd, target, block_bytes, max_row, min_item)
        index = 0
        for weight_path in plan.weight_files:
            in_file = sorted((t for t in plan.tensors if t.file.path == weight_path), key=lambda t: t.info.start)
            if not in_file:
                continue
            digest = hashlib.sha256()
            complete = True
            with open(weight_path, "rb", buffering=0) as f:
                head = bytearray(in_file[0].file.data_start)
                read_exact(f, memoryview(head), weight_path, "header")
                streamer.hash(digest, memoryview(head))
                covered = len(head)
                for t in in_file:
                    complete = complete and t.info.start == covered
                    streamer.tensor(f, t, offsets[t.entry.name], digest)
                    covered = t.info.end
                    done += t.info.nbytes
                    index += 1
                    if progress is not None:
                        progress(Progress(index, len(plan.tensors), t.entry.name, done, total,
                                          time.perf_counter() - start))
            streamer.hasher.drain()
            if complete and covered == weight_path.stat().st_size:
                hashes[weight_path.name] = digest.hexdigest()
        gate = gate_to_ours(plan.gate)
        streamer.write([(_as_bytes(gate[k]), offsets[f"gate.{k}"]) for k in GATE_KEYS])
        s, streamer = streamer, None
        s.close()
    finally:
        if streamer is not None:  # failing on the main thread: stop the workers, keep that error
            try:
                streamer.close()
            except BaseException:
                pass
        os.close(fd)
    return hashes
