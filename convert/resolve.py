"""Resolve ``--model``: a local directory, or a Hugging Face Hub repository id (§4.6).

Importing this module never touches Hugging Face's offline settings (``HF_HUB_OFFLINE``,
``TRANSFORMERS_OFFLINE``): the caller's environment decides, and ``huggingface_hub`` is only
imported when a download is actually needed.
"""

from __future__ import annotations

import hashlib
import pathlib

# The reference's inference allow-list: exactly what inference needs, never "*" or "*.pt".
INFERENCE_PATTERNS: tuple[str, ...] = (
    "config.json", "generation_config.json", "alodlm_config.json", "exit_gate.pt",
    "*.safetensors", "*.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "tokenizer.model", "vocab.json", "vocab.txt", "merges.txt",
    "*.jinja", "chat_templates/*.jinja",
)


def resolve_model(model: str | pathlib.Path) -> pathlib.Path:
    """An existing directory as is; a missing explicit path is an error; anything else is a Hub id.

    Raises ``ValueError("The local model directory does not exist")`` for an absolute path or one
    starting with ``.`` or ``~`` that is not a directory, without trying to download, and
    :class:`ModelNotFoundError` (a ``ValueError``: one line) when the Hub download fails: no
    connection and no cached copy, ``HF_HUB_OFFLINE=1`` and no cached copy, an unknown or
    inaccessible id, an HTTP error.
    """
    text = str(model)
    path = pathlib.Path(text).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.is_absolute() or text.startswith((".", "~")):
        raise ValueError(f"The local model directory does not exist: {text}")
    from huggingface_hub import errors, snapshot_download

    try:
        return pathlib.Path(snapshot_download(repo_id=text, allow_patterns=list(INFERENCE_PATTERNS)))
    except errors.LocalEntryNotFoundError as error:  # offline, or the Hub unreachable; not cached
        raise ModelNotFoundError(_not_cached(text, error)) from None
    except errors.RepositoryNotFoundError as error:  # gated repositories included
        raise ModelNotFoundError(
            f"model {text!r}: the Hugging Face Hub has no model of that name that this machine may "
            f"read ({_reason(error)}); check the id, log in (hf auth login, or HF_TOKEN) for a "
            f"gated or private model, or pass a local model directory") from None
    except errors.HFValidationError:
        raise ModelNotFoundError(
            f"model {text!r} is neither an existing local directory nor a valid Hugging Face "
            f"model id (owner/name)") from None
    except errors.HfHubHTTPError as error:
        raise ModelNotFoundError(
            f"model {text!r}: the Hugging Face Hub download failed ({_reason(error)}); retry, or "
            f"{_alternatives(text)}") from None


def model_files(directory: str | pathlib.Path) -> dict[str, str]:
    """The identity of a resolved model directory: each file inference reads
    (:data:`INFERENCE_PATTERNS`), by its path in the directory, mapped to its content digest.

    A file in the Hugging Face cache is a link to a blob named by its content hash, and that name
    is its digest (``hf-blob:<name>``); any other file is hashed (``sha256:<hex>``), several at a
    time (a multi-GB checkpoint costs about as long as reading it once).
    """
    import concurrent.futures

    root = pathlib.Path(directory)
    paths = sorted({path for pattern in INFERENCE_PATTERNS for path in root.glob(pattern)
                    if path.is_file()})

    def digest(path: pathlib.Path) -> str:
        target = path.resolve()
        if path.is_symlink() and target.parent.name == "blobs":
            return "hf-blob:" + target.name
        hasher = hashlib.sha256()
        with open(target, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 24), b""):
                hasher.update(block)
        return "sha256:" + hasher.hexdigest()

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        digests = list(pool.map(digest, paths))
    return {path.relative_to(root).as_posix(): value for path, value in zip(paths, digests)}


def _alternatives(model: str, offline: bool = False) -> str:
    prefetch = f"hf download {model} where the Hub is reachable, with the same HF_HOME"
    if offline:
        return f"pass a local model directory (--model /path/to/checkpoint), or prefetch it ({prefetch})"
    return (f"pass a local model directory (--model /path/to/checkpoint), or use a prefetched cache "
            f"({prefetch}, then run with HF_HUB_OFFLINE=1)")


class ModelNotFoundError(ValueError):
    """``--model`` names neither a local directory nor a model the Hub (or its cache) provides.

    The message is one line: the model id, what went wrong, the cache looked in and what to do."""


def _reason(error: BaseException) -> str:
    """The underlying failure of a Hub error, in one line (``ConnectError: [Errno -2] ...``)."""
    cause = error.__cause__ or error.__context__
    if cause is not None:
        error = cause
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _not_cached(model: str, error: BaseException) -> str:
    from huggingface_hub import constants

    offline = bool(constants.HF_HUB_OFFLINE)
    why = ("HF_HUB_OFFLINE=1 is set" if offline
           else f"the Hugging Face Hub could not be reached ({_reason(error)})")
    return (f"model {model!r}: {why}, and the Hub cache {constants.HF_HUB_CACHE} has no copy of it; "
            f"{_alternatives(model, offline)}")
