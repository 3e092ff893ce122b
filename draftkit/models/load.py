"""Loading resolved models and tokenizers onto a device, in one place."""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftkit.errors import ModelError
from draftkit.models.resolve import ResolvedModel, Role, resolve_model

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def parse_dtype(name: str | None, device: str) -> "torch.dtype":
    """``auto`` is bfloat16 on CUDA and float32 on CPU (bf16 matmuls are slow on most CPUs)."""
    import torch

    name = (name or "auto").lower()
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if name not in table:
        raise ModelError(f"unknown dtype '{name}'; use auto, float32, bfloat16 or float16")
    return table[name]


def load_tokenizer(model: str | ResolvedModel, role: Role = "target") -> "PreTrainedTokenizerBase":
    from transformers import AutoTokenizer

    resolved = model if isinstance(model, ResolvedModel) else resolve_model(model, role)
    try:
        return AutoTokenizer.from_pretrained(resolved.path)
    except Exception as e:
        raise ModelError(f"cannot load the {role} tokenizer from {resolved.path} "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                         f"the directory needs tokenizer files") from None


def load_model(model: str | ResolvedModel, role: Role = "target", device: str | None = None,
               dtype: str | None = "auto") -> "PreTrainedModel":
    """A causal LM in eval mode on ``device``."""
    from transformers import AutoModelForCausalLM

    resolved = model if isinstance(model, ResolvedModel) else resolve_model(model, role)
    device = device or default_device()
    try:
        lm = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=parse_dtype(dtype, device))
    except Exception as e:
        raise ModelError(f"cannot load the {role} model from {resolved.path} "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                         f"it must be a causal LM directory with config.json and weights") from None
    return lm.to(device).eval()


class ModelPair:
    """A target, an optional draft checked against it, and the shared tokenizer."""

    def __init__(self, target: "PreTrainedModel", tokenizer: "PreTrainedTokenizerBase",
                 draft: "PreTrainedModel | None", target_ref: ResolvedModel,
                 draft_ref: ResolvedModel | None):
        self.target, self.tokenizer, self.draft = target, tokenizer, draft
        self.target_ref, self.draft_ref = target_ref, draft_ref


def load_pair(target: str, draft: str | None = None, device: str | None = None,
              dtype: str | None = "auto") -> ModelPair:
    """Resolve and load target (and draft), checking compatibility before loading weights."""
    from draftkit.models.compat import check_compatible

    target_ref = resolve_model(target, "target")
    draft_ref = resolve_model(draft, "draft") if draft else None
    tokenizer = load_tokenizer(target_ref, "target")
    if draft_ref is not None:
        from transformers import AutoConfig

        check_compatible(tokenizer, load_tokenizer(draft_ref, "draft"),
                         AutoConfig.from_pretrained(target_ref.path),
                         AutoConfig.from_pretrained(draft_ref.path))
    target_model = load_model(target_ref, "target", device, dtype)
    draft_model = load_model(draft_ref, "draft", device, dtype) if draft_ref else None
    return ModelPair(target_model, tokenizer, draft_model, target_ref, draft_ref)
