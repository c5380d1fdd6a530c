"""Prompt templates (Jinja, as transformers' chat templates) and the checkpoint's chat template.

Each benchmark renders its rows with a default template shipped in ``templates/`` (ours, not the
paper's: zero-shot instructions whose answer format the scorer's extractors read) or with a
``--template`` file. Templates run in Jinja's immutable sandbox with ``trim_blocks`` and
``lstrip_blocks`` (transformers' settings for chat templates) and strict undefined variables, so
a misspelt variable is an error rather than an empty string.

With ``--model`` the rendered text becomes the single user turn of the checkpoint's own chat
template, with the generation prompt: ``apply_chat_template(..., add_generation_prompt=True)``.
``--thinking`` sets ``enable_thinking=True`` for chat templates that read that switch (Qwen3's);
for them the default is ``enable_thinking=False``. A chat template without the switch refuses
``--thinking``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
from typing import Any

__all__ = ["Template", "TemplateError", "default_template", "template_from_file", "ChatWrapper",
           "TEMPLATE_DIR"]

TEMPLATE_DIR = pathlib.Path(__file__).resolve().parent / "templates"


class TemplateError(ValueError):
    """A template that cannot be read, parsed or rendered (one line naming it)."""


def _environment():
    import jinja2
    import jinja2.ext
    import jinja2.sandbox

    return jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined,
        extensions=[jinja2.ext.loopcontrols])


@dataclasses.dataclass(frozen=True)
class Template:
    """A prompt template: where it came from, its text and the text's SHA-256."""

    origin: str
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def compiled(self):
        import jinja2

        try:
            return _environment().from_string(self.text)
        except jinja2.TemplateSyntaxError as error:
            raise TemplateError(f"{self.origin}:{error.lineno}: template syntax error: "
                                f"{error.message}") from None

    def render(self, context: dict[str, Any], compiled=None) -> str:
        """The prompt for one item; ``compiled`` is :meth:`compiled`, reused across items."""
        import jinja2

        try:
            return (compiled or self.compiled()).render(**context)
        except jinja2.UndefinedError as error:
            raise TemplateError(f"{self.origin}: {error.message} (variables: "
                                f"{', '.join(sorted(context))})") from None
        except jinja2.TemplateError as error:
            raise TemplateError(f"{self.origin}: {type(error).__name__}: {error}") from None

    def describe(self) -> dict[str, str]:
        return {"template": self.origin, "sha256": self.sha256}


def default_template(filename: str) -> Template:
    return Template(f"default:{filename}", (TEMPLATE_DIR / filename).read_text(encoding="utf-8"))


def template_from_file(path: str) -> Template:
    try:
        text = pathlib.Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TemplateError(f"{path}: cannot read the template: {error}") from None
    template = Template(path, text)
    template.compiled()  # a syntax error is reported before any source is read
    return template


def _tokenizer_patterns() -> list[str]:
    """The checkpoint files a tokenizer and its chat template need: the inference allow-list
    (alodlm_convert.resolve) without the weights."""
    from alodlm_convert.resolve import INFERENCE_PATTERNS

    return [p for p in INFERENCE_PATTERNS if "safetensors" not in p and not p.endswith(".pt")]


def _tokenizer_directory(model: str) -> pathlib.Path:
    path = pathlib.Path(model).expanduser()
    if path.is_dir() or path.is_absolute() or model.startswith((".", "~")):
        from alodlm_convert.resolve import resolve_model

        return resolve_model(model)  # a local directory, or "does not exist"
    from huggingface_hub import snapshot_download

    try:
        return pathlib.Path(snapshot_download(repo_id=model, allow_patterns=_tokenizer_patterns()))
    except Exception as error:  # offline, not found, gated: one line
        raise ValueError(f"could not fetch the tokenizer of {model!r} from the Hugging Face Hub: "
                         f"{type(error).__name__}: {' '.join(str(error).split())}") from None


def _load_tokenizer(model: str, directory: pathlib.Path):
    """The checkpoint's tokenizer, for its chat template and special tokens.

    A ``tokenizer.json`` is read as a fast tokenizer directly; ``AutoTokenizer`` (which reads the
    model config and, through it, imports torch when installed) only for other tokenizers.
    """
    if (directory / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast as loader
    else:
        from transformers import AutoTokenizer as loader
    try:
        return loader.from_pretrained(str(directory))
    except Exception as error:
        raise ValueError(f"{model}: cannot load its tokenizer: {type(error).__name__}: "
                         f"{' '.join(str(error).split())}") from None


class ChatWrapper:
    """The checkpoint's chat template around a rendered prompt (one user turn)."""

    def __init__(self, model: str, *, thinking: bool = False) -> None:
        import jinja2
        import jinja2.meta

        self.tokenizer = _load_tokenizer(model, _tokenizer_directory(model))
        source = self.tokenizer.chat_template
        if not isinstance(source, str) or not source.strip():
            raise ValueError(f"{model}: the checkpoint has no chat template; drop --model to write "
                             "prompts without one")
        variables = jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(source))
        self.has_thinking_switch = "enable_thinking" in variables
        if thinking and not self.has_thinking_switch:
            raise ValueError(f"--thinking: the chat template of {model} has no enable_thinking "
                             "switch")
        self.model = model
        self.thinking = thinking
        self.template_sha256 = hashlib.sha256(source.encode("utf-8")).hexdigest()

    def wrap(self, text: str) -> str:
        extra = {"enable_thinking": self.thinking} if self.has_thinking_switch else {}
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False,
            **extra)

    def describe(self) -> dict[str, Any]:
        return {"model": self.model, "chat_template_sha256": self.template_sha256,
                "enable_thinking": self.thinking if self.has_thinking_switch else None}
