"""Model configuration: the Qwen3 backbone values plus the four recurrence fields inference needs.

Sources (MODEL_AND_DECODING.md §4.1, §4.4, §4.8):

* ``config.json`` — the Hugging Face Qwen3 config. It must describe a plain, untied, bias-free
  Qwen3 with default RoPE; ``rope_theta`` may sit at top level or inside ``rope_parameters`` /
  ``rope_scaling`` (transformers 5 writes the former).
* ``alodlm_config.json`` — the JSON dump of the reference's recurrence ``ModelConfig``; or, when a
  checkpoint has none (or the caller wants to override it), the ``model:`` section of a YAML file
  (the reference's ``--model-config``). Missing fields take the reference's defaults; unknown
  fields are an error, as they are for the reference's dataclass constructor.

Every violation is collected and reported together in one :class:`CheckpointError` that names the
file and field, so a broken checkpoint is diagnosed in a single run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Any

from alodlm_convert.errors import CheckpointError, raise_if_problems

CONFIG_FILE = "config.json"
RECURRENCE_FILE = "alodlm_config.json"

# The reference's recurrence ModelConfig fields and their defaults (§4.4).
RECURRENCE_DEFAULTS: dict[str, Any] = {
    "loop_start": 10,
    "loop_end": 26,
    "max_depth": 4,
    "depth_prior_c": 0.4,
    "kl_beta_mi": 0.1,
    "kl_beta_marg": 1.0,
    "gate_init_pi": [0.25, 0.25, 0.25, 0.25],
    "mask_token_id": 151665,
    "block_size": 32,
    "gradient_checkpointing": True,
    "gradient_checkpointing_stride": 2,
    "attention_backend": "sdpa",
    "compile_layers": False,
}

_POSITIVE_INT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                        "num_attention_heads", "num_key_value_heads", "head_dim",
                        "max_position_embeddings")
_ROPE_KEYS_ALLOWED = {"rope_type", "type", "rope_theta"}
_GATE_PI_TOLERANCE = 1e-6


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Everything the JAX model and decoders need to know about a checkpoint.

    Layer groups are half-open ranges: prelude ``[0, loop_start)``, core ``[loop_start, loop_end)``,
    coda ``[loop_end, num_hidden_layers)``. Constructing one validates it (all problems together).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    loop_start: int
    loop_end: int
    max_depth: int
    mask_token_id: int

    def __post_init__(self) -> None:
        problems = [f"ModelConfig.{field}: {msg}" for field, msg in _check_values(dataclasses.asdict(self))]
        raise_if_problems(problems)

    @property
    def num_prelude_layers(self) -> int:
        return self.loop_start

    @property
    def num_core_layers(self) -> int:
        return self.loop_end - self.loop_start

    @property
    def num_coda_layers(self) -> int:
        return self.num_hidden_layers - self.loop_end

    def layer_group(self, layer: int) -> tuple[str, int]:
        """Maps a global layer index to ``(group name, index inside the group)``."""
        if not 0 <= layer < self.num_hidden_layers:
            raise IndexError(f"layer {layer} outside [0, {self.num_hidden_layers})")
        if layer < self.loop_start:
            return "prelude", layer
        if layer < self.loop_end:
            return "core", layer - self.loop_start
        return "coda", layer - self.loop_end


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_backbone(v: dict[str, Any]) -> list[tuple[str, str]]:
    """Types and ranges of the Qwen3 fields: (field, problem) pairs."""
    out: list[tuple[str, str]] = []
    for field in _POSITIVE_INT_FIELDS:
        if not _is_int(v.get(field)) or v[field] < 1:
            out.append((field, f"must be a positive integer, got {v.get(field)!r}"))
    for field in ("rope_theta", "rms_norm_eps"):
        x = v.get(field)
        if not _is_real(x) or not math.isfinite(x) or x <= 0:
            out.append((field, f"must be a finite positive number, got {x!r}"))
    n_q, n_kv, d_h = v.get("num_attention_heads"), v.get("num_key_value_heads"), v.get("head_dim")
    if _is_int(n_q) and _is_int(n_kv) and n_q > 0 and n_kv > 0 and n_q % n_kv:
        out.append(("num_key_value_heads", f"{n_kv} does not divide num_attention_heads {n_q}"))
    if _is_int(d_h) and d_h > 0 and d_h % 2:
        out.append(("head_dim", f"must be even for rotate-half RoPE, got {d_h}"))
    return out


def _check_recurrence(v: dict[str, Any], num_layers: Any, vocab_size: Any) -> list[tuple[str, str]]:
    """Types and ranges of the four inference fields (§4.4); the ranges that depend on the
    backbone are checked only when its values are usable."""
    out: list[tuple[str, str]] = []
    for field in ("loop_start", "loop_end", "max_depth", "mask_token_id"):
        if not _is_int(v.get(field)):
            out.append((field, f"must be an integer (booleans rejected), got {v.get(field)!r}"))
    start, end = v.get("loop_start"), v.get("loop_end")
    if _is_int(start) and _is_int(end):
        if _is_int(num_layers) and num_layers > 0:
            if not 0 <= start < end <= num_layers:
                out.append(("loop_start/loop_end", f"need 0 <= loop_start < loop_end <= num_hidden_layers, "
                                                   f"got {start}, {end}, {num_layers}"))
        elif not 0 <= start < end:
            out.append(("loop_start/loop_end", f"need 0 <= loop_start < loop_end, got {start}, {end}"))
    if _is_int(v.get("max_depth")) and v["max_depth"] < 2:
        out.append(("max_depth", f"must be >= 2, got {v['max_depth']}"))
    mask = v.get("mask_token_id")
    if _is_int(mask):
        if _is_int(vocab_size) and vocab_size > 0:
            if not 0 <= mask < vocab_size:
                out.append(("mask_token_id", f"must be in [0, vocab_size={vocab_size}), got {mask}"))
        elif mask < 0:
            out.append(("mask_token_id", f"must be >= 0, got {mask}"))
    return out


def _check_values(v: dict[str, Any]) -> list[tuple[str, str]]:
    """All checks of a complete set of ModelConfig values."""
    return _check_backbone(v) + _check_recurrence(v, v.get("num_hidden_layers"), v.get("vocab_size"))


def _rope_theta(raw: dict[str, Any], problems: list[str]) -> Any:
    """Finds rope_theta (top level or nested) and rejects any non-default RoPE."""
    thetas: list[tuple[str, Any]] = []
    if "rope_theta" in raw:
        thetas.append(("rope_theta", raw["rope_theta"]))
    for key in ("rope_parameters", "rope_scaling"):
        block = raw.get(key)
        if block is None:
            continue
        if not isinstance(block, dict):
            problems.append(f"{CONFIG_FILE}: {key}: must be an object or null, got {block!r}")
            continue
        kind = block.get("rope_type", block.get("type", "default"))
        if kind != "default":
            problems.append(f"{CONFIG_FILE}: {key}.rope_type: non-default RoPE {kind!r} is not supported")
        extra = sorted(set(block) - _ROPE_KEYS_ALLOWED)
        if extra:
            problems.append(f"{CONFIG_FILE}: {key}: RoPE scaling is not supported (keys {extra})")
        if "rope_theta" in block:
            thetas.append((f"{key}.rope_theta", block["rope_theta"]))
    if not thetas:
        problems.append(f"{CONFIG_FILE}: rope_theta: missing (looked at top level, rope_parameters, rope_scaling)")
        return None
    values = {json.dumps(t) for _, t in thetas}
    if len(values) > 1:
        problems.append(f"{CONFIG_FILE}: rope_theta: conflicting values {dict(thetas)}")
    return thetas[0][1]


def _backbone_values(raw: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """Checks the Qwen3 config for features we do not implement and extracts our fields."""
    where = CONFIG_FILE
    if raw.get("model_type") != "qwen3":
        problems.append(f"{where}: model_type: must be 'qwen3', got {raw.get('model_type')!r}")
    if raw.get("tie_word_embeddings", False) is not False:
        problems.append(f"{where}: tie_word_embeddings: must be false (ALoDLM has an untied lm_head), "
                        f"got {raw.get('tie_word_embeddings')!r}")
    if raw.get("attention_bias"):
        problems.append(f"{where}: attention_bias: must be false (bias-free Qwen3 attention)")
    if raw.get("hidden_act", "silu") != "silu":
        problems.append(f"{where}: hidden_act: must be 'silu', got {raw.get('hidden_act')!r}")
    if raw.get("use_sliding_window"):
        problems.append(f"{where}: use_sliding_window: sliding-window attention is not supported")
    if raw.get("quantization_config"):
        problems.append(f"{where}: quantization_config: quantized checkpoints are not supported")

    values: dict[str, Any] = {}
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "max_position_embeddings", "rms_norm_eps"):
        if field not in raw:
            problems.append(f"{where}: {field}: missing")
        values[field] = raw.get(field)
    values["num_key_value_heads"] = raw.get("num_key_value_heads", raw.get("num_attention_heads"))
    head_dim = raw.get("head_dim")
    if head_dim is None:
        hidden, heads = raw.get("hidden_size"), raw.get("num_attention_heads")
        if _is_int(hidden) and _is_int(heads) and heads > 0:
            if hidden % heads:
                problems.append(f"{where}: head_dim: missing and hidden_size {hidden} is not a "
                                f"multiple of num_attention_heads {heads}")
            head_dim = hidden // heads
    values["head_dim"] = head_dim
    values["rope_theta"] = _rope_theta(raw, problems)
    return values


def _recurrence_values(raw: dict[str, Any], where: str, problems: list[str]) -> dict[str, Any]:
    """Fills the reference's defaults, rejects unknown fields and checks ``gate_init_pi``."""
    unknown = sorted(set(raw) - set(RECURRENCE_DEFAULTS))
    if unknown:
        problems.append(f"{where}: unknown field(s) {unknown}")
    merged = {**RECURRENCE_DEFAULTS, **{k: raw[k] for k in raw if k in RECURRENCE_DEFAULTS}}
    pi, depth = merged["gate_init_pi"], merged["max_depth"]
    if not isinstance(pi, (list, tuple)) or not all(_is_real(p) for p in pi):
        problems.append(f"{where}: gate_init_pi: must be a list of numbers, got {pi!r}")
    else:
        if _is_int(depth) and len(pi) != depth:
            problems.append(f"{where}: gate_init_pi: length {len(pi)} != max_depth {depth}")
        if not all(math.isfinite(p) and p > 0 for p in pi):
            problems.append(f"{where}: gate_init_pi: every entry must be positive, got {list(pi)}")
        elif abs(math.fsum(pi) - 1.0) > _GATE_PI_TOLERANCE:
            problems.append(f"{where}: gate_init_pi: must sum to 1, sums to {math.fsum(pi)!r}")
    return merged


def _read_json(path: pathlib.Path, problems: list[str]) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.append(f"{path.name}: missing")
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append(f"{path.name}: unreadable JSON ({exc})")
        return None
    if not isinstance(data, dict):
        problems.append(f"{path.name}: must hold a JSON object")
        return None
    return data


def read_recurrence_yaml(path: str | pathlib.Path, problems: list[str]) -> dict[str, Any] | None:
    """Reads the ``model:`` section of a training/recurrence YAML file (the reference's --model-config)."""
    import yaml

    path = pathlib.Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.append(f"{path}: model config file does not exist")
        return None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        problems.append(f"{path}: unreadable YAML ({' '.join(str(exc).split())})")
        return None
    section = data.get("model") if isinstance(data, dict) else None
    if not isinstance(section, dict):
        problems.append(f"{path}: model: missing or not a mapping (expected a 'model:' section)")
        return None
    return section


def load_recurrence(model_dir: str | pathlib.Path, model_config_yaml: str | pathlib.Path | None = None
                    ) -> tuple[dict[str, Any] | None, str, list[str]]:
    """The full recurrence config (defaults filled), the name of its source, and problems found."""
    problems: list[str] = []
    model_dir = pathlib.Path(model_dir)
    if model_config_yaml is not None:
        where = str(model_config_yaml)
        raw = read_recurrence_yaml(model_config_yaml, problems)
    else:
        where = RECURRENCE_FILE
        if not (model_dir / RECURRENCE_FILE).is_file():
            problems.append(f"{RECURRENCE_FILE}: missing (the checkpoint needs it, or pass an "
                            f"explicit recurrence config with --model_config)")
            return None, where, problems
        raw = _read_json(model_dir / RECURRENCE_FILE, problems)
    if raw is None:
        return None, where, problems
    return _recurrence_values(raw, where, problems), where, problems


def load_model_config(model_dir: str | pathlib.Path, model_config_yaml: str | pathlib.Path | None = None
                      ) -> ModelConfig:
    """Reads and validates ``config.json`` plus the recurrence config of a checkpoint directory.

    ``model_config_yaml``, when given, replaces ``alodlm_config.json`` (explicit beats implicit).
    Raises :class:`CheckpointError` listing every problem, each naming its file and field.
    """
    model_dir = pathlib.Path(model_dir)
    problems: list[str] = []
    if not model_dir.is_dir():
        raise CheckpointError(f"model directory {model_dir} does not exist")
    raw = _read_json(model_dir / CONFIG_FILE, problems)
    backbone = _backbone_values(raw, problems) if raw is not None else {}
    recurrence, rec_where, rec_problems = load_recurrence(model_dir, model_config_yaml)
    problems.extend(rec_problems)

    values = dict(backbone)
    if raw is not None:
        problems.extend(f"{CONFIG_FILE}: {field}: {msg}" for field, msg in _check_backbone(backbone))
    if recurrence is not None:
        for field, msg in _check_recurrence(recurrence, backbone.get("num_hidden_layers"),
                                            backbone.get("vocab_size")):
            if field == "mask_token_id" and "vocab_size" in msg:
                msg += f" (vocab_size from {CONFIG_FILE})"
            problems.append(f"{rec_where}: {field}: {msg}")
        values.update({k: recurrence[k] for k in ("loop_start", "loop_end", "max_depth", "mask_token_id")})
    # Deduplicate while keeping order (a field may be reported by two checks).
    problems = list(dict.fromkeys(problems))
    raise_if_problems(problems, where=str(model_dir))
    values["rope_theta"] = float(values["rope_theta"])  # JSON may spell 1e6 as 1000000
    values["rms_norm_eps"] = float(values["rms_norm_eps"])
    return ModelConfig(**values)


def recurrence_dict(model_dir: str | pathlib.Path, model_config_yaml: str | pathlib.Path | None = None
                    ) -> dict[str, Any]:
    """The validated recurrence config as the reference dumps it (for a converted directory)."""
    recurrence, _, problems = load_recurrence(model_dir, model_config_yaml)
    raise_if_problems(problems, where=str(model_dir))
    assert recurrence is not None
    return recurrence
