"""Resolve ``--model``: a local directory, or a Hugging Face Hub repository id (§4.6).

Importing this module never touches Hugging Face's offline settings (``HF_HUB_OFFLINE``,
``TRANSFORMERS_OFFLINE``): the caller's environment decides, and ``huggingface_hub`` is only
imported when a download is actually needed.
"""

from __future__ import annotations

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
    starting with ``.`` or ``~`` that is not a directory, without trying to download.
    """
    text = str(model)
    path = pathlib.Path(text).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.is_absolute() or text.startswith((".", "~")):
        raise ValueError(f"The local model directory does not exist: {text}")
    from huggingface_hub import snapshot_download

    return pathlib.Path(snapshot_download(repo_id=text, allow_patterns=list(INFERENCE_PATTERNS)))
