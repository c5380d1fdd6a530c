"""Text in, generation result out: model loading, tokenizer, prompts, stop ids, engine choice.

:class:`Generator` is what the generate and evaluate commands use::

    gen = build_generator(model="path/or/hub-id", precision="bf16",
                          decode_config=DecodeConfig(q=0.4, tau=0.4))
    gen.generate_ids(gen.chat_prompt_ids("Return value one"))   # the §6.6 result dict
    gen.generate(formatted_prompt)   # evaluation: the prompt is tokenized verbatim
    gen.generate_batch([p1, p2])     # several verbatim prompts (compiled engine, batch_size > 1)

Importing this module does not touch Hugging Face's offline settings (MODEL_AND_DECODING.md §4.6):
``HF_HUB_OFFLINE`` stays whatever the caller's environment says.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any, Iterator, Sequence

from alodlm_jax.config import (DEFAULT_ENGINE, ENGINE_NAMES, ENGINES, DecodeConfig,
                               default_compilation_cache_dir)

STOP_TOKEN_NAMES = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>")
PRECISIONS = ("fp32", "bf16")
DEVICES = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "tpu": "tpu"}


def stop_ids_for(tokenizer) -> list[int]:
    """§4.7: the tokenizer's ``eos_token_id`` (int or list) plus the named stop tokens it has."""
    ids: list[int] = []
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.append(eos)
    elif eos is not None:
        ids.extend(int(e) for e in eos)
    vocab = tokenizer.get_vocab()
    ids.extend(vocab[name] for name in STOP_TOKEN_NAMES if name in vocab)
    return sorted(set(ids))


def load_tokenizer(model_dir: pathlib.Path):
    """§4.5 step 4: the checkpoint's tokenizer; it must carry a chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{model_dir}: the tokenizer has no chat template")
    vocab = tokenizer.get_vocab()
    if "<|im_end|>" in vocab:
        tokenizer.pad_token = "<|im_end|>"
    elif tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def default_device() -> str:
    """The ``--device`` default: ``cuda`` when JAX's default backend is a GPU, ``tpu`` on TPUs,
    else ``cpu``. Imports JAX, so commands call it only when they will generate."""
    import jax

    return {"gpu": "cuda", "tpu": "tpu"}.get(jax.default_backend(), "cpu")


def jax_device(device: str):
    """This process's first JAX device of the platform a ``--device`` value names (ValueError if
    absent). After ``jax.distributed.initialize``, ``jax.devices(...)[0]`` would be process 0's
    device on every process; decoding must use a device this process can address."""
    import jax

    if device not in DEVICES:
        raise ValueError(f"device must be one of {sorted(DEVICES)}, got {device!r}")
    try:
        devices = jax.local_devices(backend=DEVICES[device])
    except RuntimeError:
        devices = []
    if not devices:
        raise ValueError(missing_device_message(device))
    return devices[0]


def missing_device_message(device: str) -> str:
    """Why JAX sees no ``device`` here, and what to install: the base install's jaxlib is
    CPU-only; a CUDA GPU needs JAX's CUDA plugin (the project's ``cuda`` extra), a TPU JAX's TPU
    runtime, libtpu (the project's ``tpu`` extra)."""
    import importlib.util

    import jax

    message = f"JAX has no {device} device on this machine"
    runtime = _DEVICE_RUNTIMES.get(device)
    if runtime is None:
        return message
    module, what, installed, extra, pin, noun, check = runtime
    if device == "cuda" and importlib.util.find_spec("jax_cuda13_plugin") is not None:
        installed = "jax-cuda13-plugin"  # the cuda13 extra's (a GPU image's JAX may bring it)
    elif importlib.util.find_spec(module) is None:
        return (f"{message}: {what} is not installed; install it with: python -m pip install "
                f"'alodlm-jax[{extra}]' (from a checkout: python -m pip install -e '.[{extra}]'), "
                f"which pins {pin}=={jax.__version__}")
    return f"{message}: {installed} is installed but found no usable {noun} ({check})"


# device -> (module, what it is, its package, the project's extra, the pin, the device, what to check)
_DEVICE_RUNTIMES = {
    "cuda": ("jax_cuda12_plugin", "JAX's CUDA plugin (jax-cuda12-plugin)", "jax-cuda12-plugin",
             "cuda", "jax[cuda12]", "GPU",
             "check nvidia-smi, the driver version and CUDA_VISIBLE_DEVICES"),
    "tpu": ("libtpu", "JAX's TPU runtime (libtpu)", "libtpu", "tpu", "jax[tpu]", "TPU",
            "check that this is a TPU VM and that no other process holds the TPU"),
}


BATCH_NEEDS_COMPILED = "--batch_size > 1 needs --engine compiled"


def make_engine(engine: str, cfg, params, decode: DecodeConfig, stop_ids: Sequence[int], *,
                batch_size: int = 1, compilation_cache_dir: str | None = None, mesh=None):
    """The decoding engine by name: ``portable`` or ``compiled``.

    ``batch_size`` (requests decoded together by ``generate_batch``) needs the compiled engine;
    ``compilation_cache_dir`` turns on JAX's persistent compilation cache for either engine;
    ``mesh``: the ``("data", "model")`` mesh ``params`` are already sharded on, or None (one
    device). The compiled engine runs its programs on it (:mod:`alodlm_jax.decode.layout`); the
    portable engine creates its KV cache in the mesh's shardings (``model`` only).
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {list(ENGINES)}, got {engine!r}")
    check_batch_size(engine, batch_size)
    if engine == "portable":
        from alodlm_jax.decode.portable import PortableEngine

        if compilation_cache_dir:
            enable_compilation_cache(compilation_cache_dir)
        cache_sharding = None
        if mesh is not None:
            from alodlm_jax.network.sharding import cache_shardings

            cache_sharding = cache_shardings(mesh, cfg)
        return PortableEngine(cfg, params, decode, stop_ids, cache_sharding=cache_sharding)
    try:
        from alodlm_jax.decode.compiled import CompiledEngine
        from alodlm_jax.decode.layout import for_mesh
    except ImportError as error:
        raise ValueError(f"the compiled engine is not available ({error})") from None
    return CompiledEngine(cfg, params, decode, stop_ids, batch_size=batch_size,
                          compilation_cache_dir=compilation_cache_dir, layout=for_mesh(mesh))


def check_batch_size(engine: str, batch_size: int) -> None:
    """ValueError unless ``batch_size`` is a positive integer the ``engine`` can decode."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"--batch_size must be a positive integer, got {batch_size!r}")
    if batch_size > 1 and engine != "compiled":
        raise ValueError(BATCH_NEEDS_COMPILED)


def enable_compilation_cache(directory: str | None) -> None:
    """JAX's persistent compilation cache in ``directory`` (every program cached, size bounded:
    :func:`alodlm_jax.decode.programs.enable_persistent_cache`); None: no-op."""
    if directory:
        from alodlm_jax.decode.programs import enable_persistent_cache

        enable_persistent_cache(str(directory))


class Generator:
    """A loaded model, its tokenizer and one decoding engine with a fixed decoding configuration."""

    def __init__(self, *, cfg, params, tokenizer, model_dir: pathlib.Path | None, precision: str,
                 device: str, engine: str = "portable", decode_config: DecodeConfig | None = None,
                 jax_device=None, batch_size: int = 1, compilation_cache_dir: str | None = None,
                 stop_ids: Sequence[int] | None = None, mesh=None):
        import jax

        self.cfg = cfg
        self.params = params
        self.tokenizer = tokenizer
        self.model_dir = model_dir
        self.precision = precision
        self.device = device
        self.engine_name = engine
        self.batch_size = batch_size
        self.mesh = mesh  # the ("data", "model") mesh params are sharded on, or None: one device
        self.decode_config = decode_config or DecodeConfig()
        self.stop_ids = stop_ids_for(tokenizer) if stop_ids is None else sorted({int(i) for i in stop_ids})
        self._jax_device = jax_device or jax.devices()[0]
        with jax.default_device(self._jax_device):
            self.engine = make_engine(engine, cfg, params, self.decode_config, self.stop_ids,
                                      batch_size=batch_size,
                                      compilation_cache_dir=compilation_cache_dir, mesh=mesh)

    def with_decode_config(self, decode_config: DecodeConfig, *,
                           stop_ids: Sequence[int] | None = None) -> "Generator":
        """A generator over the same params, tokenizer and device with other decoding settings
        (no reload; compiled programs are shared when the shapes agree).

        ``stop_ids`` replaces the stop ids (default: this generator's); the engines take them as
        a runtime input, so other stop ids compile nothing new. The mesh is kept.
        """
        other = Generator(cfg=self.cfg, params=self.params, tokenizer=self.tokenizer,
                          model_dir=self.model_dir, precision=self.precision, device=self.device,
                          engine=self.engine_name, decode_config=decode_config,
                          jax_device=self._jax_device, batch_size=self.batch_size,
                          stop_ids=self.stop_ids if stop_ids is None else stop_ids, mesh=self.mesh)
        return other

    # -- prompts ---------------------------------------------------------------------------------

    def chat_prompt_ids(self, text: str, thinking: bool = False) -> list[int]:
        """§4.7: the chat template over one user turn with the generation prompt."""
        return self.encode_verbatim(self.render_chat([{"role": "user", "content": text}],
                                                     thinking=thinking))

    def render_chat(self, messages: Sequence[dict[str, str]], *, thinking: bool = False,
                    add_generation_prompt: bool = True) -> str:
        """The checkpoint's chat template over ``messages`` as text (§4.7; thinking off unless
        asked). Without a generation prompt the last message is continued (an assistant
        prefill). :meth:`encode_verbatim` of the text is the prompt."""
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt, enable_thinking=thinking)

    def encode_verbatim(self, text: str) -> list[int]:
        """Evaluation prompts: tokenized as is, no special tokens added (SCORING.md §6.4)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode_text(self, token_ids: Sequence[int]) -> str:
        """A result's ``text``: the generated ids decoded without special tokens (§6.6)."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def check_prompt_ids(self, prompt_ids: Sequence[int]) -> list[int]:
        """The engine's request checks (MODEL_AND_DECODING.md §6.1: at least one token, ids in
        ``[0, V)``, prompt length + ``max_new_tokens`` within ``max_position_embeddings``), without
        decoding; ``ValueError`` with the engine's message otherwise."""
        return self.engine.check_request(prompt_ids)

    def check_prompt(self, prompt_text: str) -> list[int]:
        """:meth:`check_prompt_ids` of an evaluation prompt, tokenized as :meth:`generate` does."""
        return self.check_prompt_ids(self.encode_verbatim(prompt_text))

    # -- generation ------------------------------------------------------------------------------

    def generate_ids(self, prompt_ids: Sequence[int]) -> dict[str, Any]:
        """Greedy adaptive decoding of ``prompt_ids``; returns the §6.6 result dict."""
        import jax

        from alodlm_jax.decode.result import result_dict

        with jax.default_device(self._jax_device):
            out = self.engine.generate(prompt_ids)
        self.last_work = out.work
        return result_dict(out, self.decode_text(out.token_ids))

    def generate(self, prompt_text: str) -> dict[str, Any]:
        """Evaluation entry point: the prompt is tokenized verbatim (no template, no specials)."""
        return self.generate_ids(self.encode_verbatim(prompt_text))

    def generate_batch(self, prompt_texts: Sequence[str]) -> list[dict[str, Any]]:
        """Several evaluation prompts (tokenized verbatim, as :meth:`generate`), in input order.

        The compiled engine decodes them with ``batch_size`` slots and continuous batching (each
        result equals decoding the prompt alone; timings per
        :data:`alodlm_jax.decode.scheduler.BATCH_TIMING`); another engine decodes them one by one.
        """
        return list(self.generate_stream(prompt_texts))

    def generate_stream(self, prompt_texts: Sequence[str]) -> Iterator[dict[str, Any]]:
        """:meth:`generate_batch` as an iterator: each result dict in input order, as soon as it
        and every earlier one are complete."""
        import jax

        from alodlm_jax.decode.result import result_dict

        prompts = [self.encode_verbatim(text) for text in prompt_texts]
        if not prompts:
            return
        with jax.default_device(self._jax_device):
            if hasattr(self.engine, "generate_stream"):
                outs = self.engine.generate_stream(prompts, batch_size=self.batch_size)
            else:
                outs = (self.engine.generate(ids) for ids in prompts)
            for out in outs:
                self.last_work = out.work
                yield result_dict(out, self.decode_text(out.token_ids))

    def warmup_batches(self, groups: Sequence[Sequence[str]]) -> None:
        """Compiles, before any timing, the batched programs of every group of prompts.

        Each group (a :meth:`generate_batch` / :meth:`generate_stream` call) is decoded by the
        programs whose prompt bucket fits its longest prompt, with ``batch_size`` slots; buckets
        shared by groups compile once. Engines without batched programs warm up on the first
        prompt instead.
        """
        import jax

        if not groups:
            return
        if not hasattr(self.engine, "generate_batch"):
            self.warmup(groups[0][0])
            return
        from alodlm_jax.decode import batched

        with jax.default_device(self._jax_device):
            buckets = []
            for group in groups:
                longest = max(len(self.engine.check_request(self.encode_verbatim(text)))
                              for text in group)
                bucket = self.engine.bucket_for(longest, batch=self.batch_size)
                if bucket not in buckets:
                    buckets.append(bucket)
            for bucket in buckets:
                batched.compile_batch(self.engine, bucket)

    def warmup(self, prompt_text: str) -> None:
        """One discarded generation: compiles every shape this prompt needs, warms the caches."""
        self.generate(prompt_text)

    @property
    def compile_seconds(self) -> float:
        return float(self.engine.compile_seconds)

    def protocol_fields(self) -> dict[str, Any]:
        """The generator's part of the summary's protocol block (SCORING.md §7.4)."""
        fields: dict[str, Any] = {
            "decoder": ENGINE_NAMES[self.engine_name],
            "precision": self.precision,
            "device": self.device,
        }
        if self._jax_device.platform == "gpu":
            fields["gpu"] = self._jax_device.device_kind
        fields["device_kind"] = self._jax_device.device_kind
        fields["compile_seconds"] = self.compile_seconds
        options = getattr(self.engine, "compiler_options", None)
        if options:  # the XLA options the programs were compiled with, where not XLA's defaults
            fields["xla_options"] = dict(options)
        return fields


def check_task_prompts(generator: Generator, tasks: Sequence[Any]) -> None:
    """Generate mode, once the tokenizer and model limits are known and before the first task is
    decoded: every task's prompt must be one the decoder accepts (:meth:`Generator.check_prompt`).
    A prompt it refuses is a :class:`~alodlm_scoring.errors.TaskFileError` naming the task file,
    line and field ``prompt``, with the engine's message."""
    from alodlm_scoring.errors import TaskFileError
    from alodlm_scoring.tasks import where_is

    for index, task in enumerate(tasks):
        try:
            generator.check_prompt(task["prompt"])
        except ValueError as error:
            raise TaskFileError(str(error), field="prompt", **where_is(tasks, index)) from None


def build_generator(*, model: str, mesh=None, model_config: str | None = None,
                    device: str | None = None, precision: str = "fp32",
                    decode_config: DecodeConfig | None = None, engine: str = DEFAULT_ENGINE,
                    compilation_cache_dir: str | os.PathLike | bool | None = True,
                    batch_size: int = 1) -> Generator:
    """The one way to build a :class:`Generator` from a model name: every command, the harness,
    sweeps and scale-out runs call it. Its defaults are the commands' defaults: ``device`` None is
    :func:`default_device` (a GPU when JAX sees one, a TPU on TPUs, else the CPU), the compiled
    engine, fp32, the reference's decoding settings (``DecodeConfig()``), one task at a time, and
    JAX's persistent compilation cache in the commands' directory
    (``compilation_cache_dir=True``: :func:`alodlm_jax.config.default_compilation_cache_dir`; a
    path: there; None or False: none).

    ``model``: a converted directory, an HF checkpoint directory or a Hub id. ``mesh``: None (one
    device: this process's first device of ``device``'s platform, the ordinary path, with per-layer
    weights on a CPU or GPU and stacked ones on a TPU:
    :func:`~alodlm_jax.network.params.per_layer_weights`), or a :class:`~alodlm_jax.network.sharding.MeshSpec` (or
    its ``--mesh`` text) over this process's local devices: one device loads stacked weights onto
    the first of them (the layout sharded loading gives, so a one-device mesh is numerically the
    sharded runs' path); a larger mesh loads with :func:`~alodlm_jax.network.sharding.load_sharded_model`
    and the engine is built for it (:func:`make_engine`). Settings that cannot work (precision,
    engine, ``batch_size``, a layout :func:`~alodlm_jax.network.sharding.check_layout` refuses) are a
    ValueError before anything is loaded; ``compilation_cache_dir`` enables JAX's persistent
    compilation cache there.
    """
    import jax

    from alodlm_convert.resolve import resolve_model
    from alodlm_jax.network import sharding
    from alodlm_jax.network.params import load_model, per_layer_weights

    if device is None:
        device = default_device()
    if compilation_cache_dir is True:
        compilation_cache_dir = str(default_compilation_cache_dir())
    elif compilation_cache_dir is False:
        compilation_cache_dir = None
    check_batch_size(engine, batch_size)
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {list(ENGINES)}, got {engine!r}")
    spec = None
    if mesh is not None:
        spec = mesh if isinstance(mesh, sharding.MeshSpec) else sharding.MeshSpec.parse(mesh)
    if spec is not None:
        sharding.check_layout(spec, engine, batch_size)
    enable_compilation_cache(compilation_cache_dir)
    first = jax_device(device)
    model_dir = resolve_model(model)
    the_mesh = None
    if spec is None or spec.num_devices == 1:
        placement = jax.sharding.SingleDeviceSharding(first)
        cfg, params = load_model(str(model_dir), precision, sharding=lambda path, array: placement,
                                 model_config_yaml=model_config,
                                 per_layer=spec is None and per_layer_weights(first.platform))
    else:
        the_mesh = sharding.make_mesh(spec, jax.local_devices(backend=DEVICES[device]))
        cfg, params = sharding.load_sharded_model(model_dir, the_mesh, precision,
                                                  model_config_yaml=model_config)
    return Generator(cfg=cfg, params=params, tokenizer=load_tokenizer(model_dir),
                     model_dir=model_dir, precision=precision, device=device, engine=engine,
                     decode_config=decode_config, jax_device=first, batch_size=batch_size,
                     mesh=the_mesh, compilation_cache_dir=compilation_cache_dir)
