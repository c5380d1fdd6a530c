"""The adapter to the reference package (``alodlm``, PyTorch), when it is installed."""

from __future__ import annotations

from typing import Any

__all__ = ["TORCH_SIDE_OFFICIAL", "TORCH_SIDE_REFERENCE", "official_alodlm_available",
           "OfficialDecoder"]

TORCH_SIDE_OFFICIAL = "alodlm-official"
TORCH_SIDE_REFERENCE = "alodlm-jax-torch-reference"


def official_alodlm_available() -> bool:
    """Whether the reference package ``alodlm`` (with its portable decoder) can be imported."""
    try:
        import alodlm.inference  # noqa: F401, PLC0415
        import alodlm.model  # noqa: F401, PLC0415
    except Exception:  # noqa: BLE001 - any import failure means "not usable"
        return False
    return True


class OfficialDecoder:
    """The reference's portable decoder (``alodlm.model.ALoDLM`` + ``alodlm.inference.Decoder``).

    Only decoding goes through it: the reference package has no public all-passes forward, so the
    per-depth forward comparison always uses our torch reference (the report says so).
    """

    def __init__(self, model_dir: str, precision: str, device: str = "cpu"):
        import torch  # noqa: PLC0415
        from alodlm.data import load_tokenizer  # noqa: PLC0415
        from alodlm.inference import Decoder  # noqa: PLC0415
        from alodlm.model import ALoDLM  # noqa: PLC0415

        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        model = ALoDLM.from_pretrained(model_dir, config=None, dtype=dtype).to(device)
        self._decoder = Decoder(model, load_tokenizer(model_dir))

    def generate(self, prompt_ids: list[int], config: Any) -> dict:
        from alodlm.inference import DecodeConfig as OfficialDecodeConfig  # noqa: PLC0415

        return self._decoder.generate(prompt_ids, OfficialDecodeConfig(**config.as_dict()))

