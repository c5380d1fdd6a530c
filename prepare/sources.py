"""Reading a benchmark's source: a Hugging Face dataset, a local file or directory, or an EvalPlus
release file.

Hub datasets and local parquet, JSON, JSONL and CSV files (``.gz`` too) are read with the
``datasets`` library (``load_dataset_builder``, then the split asked for). EvalPlus release files
(``HumanEvalPlus*.jsonl.gz``, ``MbppPlus*.jsonl``) are read with evalplus's own reader: their inputs
are heterogeneous nested lists, which Arrow cannot type, and MBPP+ inputs need evalplus's
``mbpp_deserialize_inputs`` (tuples, sets and complex numbers that JSON flattened).

Every source knows what the manifest records about it (:attr:`Source.description`: the hub id,
config and resolved revision, or each file's SHA-256) and a :attr:`Source.fingerprint` that
changes whenever its data may have changed (the ground-truth cache is keyed by it).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pathlib
import socket
import sys
from typing import Any, Sequence

__all__ = ["Source", "SourceError", "open_source", "open_evalplus_release", "check_columns",
           "local_format", "hub_unreachable"]

_FORMATS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv"}


class SourceError(ValueError):
    """A source that cannot be read, or that does not have the columns a benchmark needs."""


class Source:
    """An opened source: :meth:`splits`, :meth:`rows` of one split, and its identity."""

    def __init__(self, name: str, description: dict[str, Any], splits: Sequence[str], reader) -> None:
        self.name = name
        self.description = description
        self._splits = list(splits)
        self._reader = reader
        # The data's identity, not where it lies: moving the files keeps the ground-truth cache.
        identity = {key: value for key, value in description.items() if key != "path"}
        self.fingerprint = hashlib.sha256(
            json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()

    def splits(self) -> list[str]:
        return list(self._splits)

    def resolve_split(self, requested: str | None, default: str | None) -> str:
        """``requested``, else ``default`` when the source has it, else the only split there is."""
        if requested is not None:
            if requested not in self._splits:
                raise SourceError(f"{self.name}: no split {requested!r} (it has: "
                                  f"{', '.join(self._splits)})")
            return requested
        if default in self._splits:
            return default
        if len(self._splits) == 1:
            return self._splits[0]
        raise SourceError(f"{self.name}: no split {default!r}; choose one with --split (it has: "
                          f"{', '.join(self._splits)})")

    def rows(self, split: str) -> list[dict[str, Any]]:
        if split not in self._splits:
            raise SourceError(f"{self.name}: no split {split!r} (it has: {', '.join(self._splits)})")
        return self._reader(split)


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def local_format(path: pathlib.Path) -> str | None:
    """The ``datasets`` builder of a data file (``parquet``, ``json`` or ``csv``), from its name."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return _FORMATS.get(suffixes[-1]) if suffixes else None


def _is_explicit_path(text: str) -> bool:
    """A path the user meant as a file (absolute, ``./``, ``~``, or a data file name), not a hub id."""
    return (os.path.isabs(text) or text.startswith((".", "~"))
            or local_format(pathlib.Path(text)) is not None)


def _local_files(path: pathlib.Path) -> tuple[str, list[pathlib.Path]]:
    if path.is_file():
        builder = local_format(path)
        if builder is None:
            raise SourceError(f"{path}: not a parquet, JSON, JSONL or CSV file (optionally .gz)")
        return builder, [path]
    files = sorted(p for p in path.rglob("*") if p.is_file() and local_format(p) is not None
                   and not any(part.startswith(".") for part in p.relative_to(path).parts))
    builders = sorted({local_format(p) for p in files})
    if not files:
        raise SourceError(f"{path}: no parquet, JSON, JSONL or CSV files in this directory")
    if len(builders) > 1:
        raise SourceError(f"{path}: data files of several formats ({', '.join(builders)}); keep one")
    return builders[0], files


def _datasets_reader(builder):
    def read(split: str) -> list[dict[str, Any]]:
        return builder.as_dataset(split=split).to_list()

    return read


HUB_PROBE_SECONDS = 3.0


def hub_unreachable(timeout: float | None = None) -> str | None:
    """Why the Hugging Face Hub cannot be reached from here (one line), or None when it can, when
    the libraries run offline (``HF_HUB_OFFLINE=1``, ``HF_DATASETS_OFFLINE=1``: they read their
    caches) or when a proxy is configured (the proxy decides).

    One TCP connection to the Hub's endpoint, name lookup included, bounded by ``timeout``
    seconds (default :data:`HUB_PROBE_SECONDS`): asked without this, ``datasets`` retries each
    request for half a minute.
    """
    timeout = HUB_PROBE_SECONDS if timeout is None else timeout
    import threading
    import urllib.parse

    import datasets.config
    from huggingface_hub import constants

    if datasets.config.HF_HUB_OFFLINE or getattr(datasets.config, "HF_DATASETS_OFFLINE", False):
        return None
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                                             "all_proxy", "HTTP_PROXY", "http_proxy")):
        return None
    url = urllib.parse.urlsplit(constants.ENDPOINT)
    address = (url.hostname or "", url.port or (80 if url.scheme == "http" else 443))
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            socket.create_connection(address, timeout=timeout).close()
            outcome.append(None)
        except OSError as error:
            outcome.append(f"{type(error).__name__}: {error}")

    thread = threading.Thread(target=probe, daemon=True)  # a name lookup ignores the timeout
    thread.start()
    thread.join(timeout)
    if not outcome:
        return f"no answer from {address[0]} within {timeout:g} s"
    return outcome[0]


def _offline_advice(benchmark: str | None) -> str:
    name = benchmark or "BENCHMARK"
    return (f"read the benchmark's own files with --source {name}=PATH (or the bundled sample "
            f"rows with --source builtin:fixtures), or, with the dataset already in the Hugging "
            f"Face cache, run with HF_HUB_OFFLINE=1")


def open_source(text: str, *, config: str | None = None, revision: str | None = None,
                benchmark: str | None = None) -> Source:
    """Open a hub dataset id or a local file or directory with the ``datasets`` library.

    A hub id while the Hub cannot be reached (:func:`hub_unreachable`) is a one-line
    :class:`SourceError` that says what to do instead, before any request is made.
    """
    import datasets

    datasets.disable_progress_bars()  # this command's own progress bar is the ground truth's
    path = pathlib.Path(text).expanduser()
    if path.exists():
        builder_name, files = _local_files(path)
        root = path if path.is_dir() else path.parent
        description = {"path": text, "format": builder_name, "files": [
            {"name": p.relative_to(root).as_posix(), "sha256": _sha256(p)} for p in files]}
        kwargs = {"data_dir": str(path)} if path.is_dir() else {"data_files": str(path)}
        try:
            builder = datasets.load_dataset_builder(builder_name, **kwargs)
            builder.download_and_prepare()
        except Exception as error:  # malformed files: one line naming the source
            raise SourceError(f"{text}: could not be read as {builder_name}: "
                              f"{type(error).__name__}: {' '.join(str(error).split())}") from None
    else:
        if _is_explicit_path(text):
            raise SourceError(f"{text}: no such file or directory")
        what = f"could not load the Hugging Face dataset {text!r}" + (
            f" (config {config!r})" if config else "")
        why = hub_unreachable()
        if why is not None:
            from huggingface_hub import constants

            raise SourceError(f"{what}: the Hugging Face Hub ({constants.ENDPOINT}) cannot be "
                              f"reached ({why}); {_offline_advice(benchmark)}")
        try:
            builder = datasets.load_dataset_builder(text, config, revision=revision)
            builder.download_and_prepare()
        except Exception as error:  # offline, not found, gated, unknown config: one line
            advice = ""
            if datasets.config.HF_HUB_OFFLINE:
                advice = (f"; without a cached copy, read the benchmark's own files with --source "
                          f"{benchmark or 'BENCHMARK'}=PATH (or --source builtin:fixtures)")
            raise SourceError(f"{what}: {type(error).__name__}: "
                              f"{' '.join(str(error).split())}{advice}") from None
        description = {"hub_id": text, "config": builder.config.name, "revision": builder.hash}
    splits = list(builder.info.splits or {})
    return Source(text, description, splits, _datasets_reader(builder))


def open_evalplus_release(text: str | None, release: str, benchmark: str | None = None) -> Source:
    """An EvalPlus release file (``release`` is ``HumanEvalPlus`` or ``MbppPlus``).

    ``text`` is a local ``.jsonl`` or ``.jsonl.gz`` path; ``None`` takes evalplus's own release
    file for its pinned version (evalplus downloads it into its cache on first use).
    """
    from evalplus.data.utils import stream_jsonl

    if text is None:
        if release == "HumanEvalPlus":
            from evalplus.data.humaneval import HUMANEVAL_PLUS_VERSION as version
            from evalplus.data.humaneval import _ready_human_eval_plus_path as ready
        else:
            from evalplus.data.mbpp import MBPP_PLUS_VERSION as version
            from evalplus.data.mbpp import _ready_mbpp_plus_path as ready
        notice = io.StringIO()  # evalplus prints a download notice: shown once it succeeded
        try:
            with contextlib.redirect_stdout(notice):
                file = pathlib.Path(ready())
        except Exception as error:  # offline: one line
            raise SourceError(f"could not get the {release} {version} release file through "
                              f"evalplus: {type(error).__name__}: {error}; give a release file "
                              f"with --source {benchmark or 'BENCHMARK'}=PATH (or the bundled "
                              f"sample rows with --source builtin:fixtures)") from None
        sys.stderr.write(notice.getvalue())
        name = f"evalplus:{release}-{version}"
    else:
        file = pathlib.Path(text).expanduser()
        name = text
        if not file.is_file():
            raise SourceError(f"{text}: no such file (EvalPlus sets are read from their release "
                              f"files, {release}.jsonl.gz or .jsonl, not from the Hub)")
    description = {"path": name, "format": "evalplus-jsonl",
                   "files": [{"name": file.name, "sha256": _sha256(file)}]}

    def read(split: str) -> list[dict[str, Any]]:
        try:
            return list(stream_jsonl(str(file)))
        except (ValueError, OSError, EOFError) as error:
            raise SourceError(f"{name}: not an EvalPlus JSONL file: {error}") from None

    return Source(name, description, ["test"], read)


def check_columns(source: Source, rows: list[dict[str, Any]], layouts: Sequence[Sequence[str]],
                  benchmark: str) -> int:
    """The index of the first layout whose columns every row has; else a one-line error."""
    present = set.intersection(*(set(row) for row in rows)) if rows else set()
    for index, columns in enumerate(layouts):
        if all(column in present for column in columns):
            return index
    expected = " or ".join("(" + ", ".join(columns) + ")" for columns in layouts)
    raise SourceError(f"{source.name}: {benchmark} expects the columns {expected}; the source has "
                      f"({', '.join(sorted(present)) or 'no rows'})")
