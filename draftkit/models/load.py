"""Loading resolved models and tokenizers onto a device, in one place.

A draft is a causal LM folder, or a folder holding an EAGLE-3 head (:mod:`draftkit.models.eagle3`),
which loads on its target: the target's device and dtype, its embedding, and its tokenizer (the
head has none of its own).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging

from draftkit.errors import ModelError
from draftkit.extras import require
from draftkit.io import read_json
from draftkit.manifest import read_manifest
from draftkit.models.compat import check_compatible, check_eagle3
from draftkit.models.eagle3 import is_eagle3
from draftkit.models.eagle3_layouts import head_config
from draftkit.models.facts import vocab_size
from draftkit.models.head_check import check_recorded_target, load_head
from draftkit.models.reduced_head import ReducedHead, attach
from draftkit.models.resolve import ResolvedModel, Role, content_hash, resolve_model

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(device: str) -> None:
    """A device this machine has, or one clear error (torch would assert or raise deep down)."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ModelError(f"--device {device!r} is not a device; use cpu, cuda or cuda:N") \
            from None
    if dev.type == "cuda" and (not torch.cuda.is_available()
                               or (dev.index or 0) >= torch.cuda.device_count()):
        raise ModelError(f"--device {device}: this machine or PyTorch build has no such CUDA "
                         f"device ({torch.cuda.device_count()} found); use --device cpu")


DTYPES = ("auto", "float32", "bfloat16", "float16")  # the names a --dtype flag offers


def parse_dtype(name: str | None, device: str) -> "torch.dtype":
    """``auto`` is bfloat16 on CUDA and float32 elsewhere (bf16 matmuls are slow on most CPUs;
    where one has them natively, decoding measures the two: :mod:`draftkit.decode.dtype_choice`)."""
    name = (name or "auto").lower()
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if name not in table:
        raise ModelError(f"unknown dtype '{name}'; use auto, float32, bfloat16 or float16")
    return table[name]


def dtype_name(model: Any) -> str:
    """The dtype ``model``'s weights are in, as a name (``float32``): what reports record and
    what an engine in another environment is asked to load it in."""
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def _quiet_transformers() -> None:
    """Per-load progress bars ("Loading weights") drown the CLI's own output."""
    logging.disable_progress_bar()


def load_tokenizer(model: str | ResolvedModel, role: Role = "target") -> "PreTrainedTokenizerBase":
    resolved = model if isinstance(model, ResolvedModel) else resolve_model(model, role)
    try:
        return AutoTokenizer.from_pretrained(resolved.path)
    except Exception as e:
        raise ModelError(f"cannot load the {role} tokenizer from {resolved.path} "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                         f"the directory needs tokenizer files") from None


def load_model(model: str | ResolvedModel, role: Role = "target", device: str | None = None,
               dtype: str | None = "auto") -> "PreTrainedModel":
    """A causal LM in eval mode on ``device`` (a LoRA adapter folder comes back merged).

    A draft folder holding ``draft_vocab.json`` gives the model its reduced head
    (``model.reduced_head``, see :mod:`draftkit.models.reduced_head`)."""
    resolved = model if isinstance(model, ResolvedModel) else resolve_model(model, role)
    if role == "draft" and is_eagle3_dir(resolved.path):
        raise ModelError(f"{resolved.path} holds an EAGLE-3 head, which loads with its target: "
                         f"pass it as the draft beside --target")
    device = device or default_device()
    check_device(device)
    _quiet_transformers()
    lm, _ = load_causal_lm(resolved.path, parse_dtype(dtype, device), role)
    if role == "draft" and Path(resolved.path).is_dir():

        head = ReducedHead.load(resolved.path, vocab_size(lm))
        if head is not None:
            attach(lm, head)
    return lm.to(device).eval()


def load_causal_lm(path, dtype: "torch.dtype", role: Role = "target"):
    """``(model, lora_merged)`` from a folder, refusing weights that do not match the config.

    transformers only warns about missing or unexpected weight keys and fills the gaps with
    random values; for a draft that silently ruins acceptance, so here it is an error.
    """
    path = Path(path)
    try:
        if (path / "adapter_config.json").is_file():
            require("train", "a LoRA adapter", ("peft",))
            from peft import AutoPeftModelForCausalLM  # optional extra: train

            # Serving engines take plain weights, not adapters: merge LoRA at load time.
            lm = AutoPeftModelForCausalLM.from_pretrained(path, dtype=dtype)
            return lm.merge_and_unload().eval(), True
        lm, info = AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                        output_loading_info=True)
    except Exception as e:
        raise ModelError(f"cannot load the {role} model from {path} "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                         f"it must be a causal LM directory with config.json and weights") from None
    bad = {k: v for k, v in info.items() if v and k in (
        "missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        kind, keys = next(iter(bad.items()))
        raise ModelError(f"{role} model {path} has {kind.replace('_', ' ')} "
                         f"({sorted(map(str, keys))[:3]}): its weights do not match its "
                         f"config.json; re-save it with save_pretrained")
    return lm.eval(), False


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
    target_ref = resolve_model(target, "target")
    draft_ref = resolve_model(draft, "draft") if draft else None
    tokenizer = load_tokenizer(target_ref, "target")
    if draft_ref is not None:
        _check_draft(tokenizer, target_ref, draft_ref)
    target_model = load_model(target_ref, "target", device, dtype)
    draft_model = _load_draft(draft_ref, target_model, device, dtype) if draft_ref else None
    return ModelPair(target_model, tokenizer, draft_model, target_ref, draft_ref)


def load_another_draft(pair: ModelPair, draft: str, device: str | None = None,
                       dtype: str | None = "auto") -> "PreTrainedModel":
    """One more draft for ``pair``'s target (a baseline, say), checked like the pair's own."""
    draft_ref = resolve_model(draft, "draft")
    _check_draft(pair.tokenizer, pair.target_ref, draft_ref)
    return _load_draft(draft_ref, pair.target, device, dtype)


def is_eagle3_dir(path: str | Path) -> bool:
    """Whether a model folder holds an EAGLE-3 head (its config.json says so, in any layout
    :mod:`draftkit.models.eagle3_layouts` reads)."""
    config = Path(path) / "config.json"
    return config.is_file() and is_eagle3(read_json(config, "model config", "re-save the "
                                                    "model", ModelError))


def _load_draft(draft_ref: ResolvedModel, target: "PreTrainedModel", device: str | None,
                dtype: str | None):
    """A draft for ``target``: an EAGLE-3 head on the target's device and dtype, reading its
    embedding; any other draft as :func:`load_model` loads it."""
    if not is_eagle3_dir(draft_ref.path):
        return load_model(draft_ref, "draft", device, dtype)

    return load_head(draft_ref.path, target, draft_ref.spec)


def check_bundle_target(target_ref: ResolvedModel, draft_ref: ResolvedModel,
                        target_sha256: str | None = None) -> None:
    """A head taken from a bundle reads the hidden states of the target it was exported with,
    which the bundle records by content hash: another target of the same shape would load and
    decode, losslessly but with next to no acceptance, so it is refused. A loose head is
    checked against the target its ``target.json`` records (:mod:`draftkit.models.head_check`).
    ``target_sha256``: the target's :func:`content_hash`, where the caller has it already."""
    if draft_ref.kind != "bundle":  # a loose head: the target its target.json records
        check_recorded_target(draft_ref.path, target_ref, draft_ref.spec)
        return
    recorded = read_manifest(Path(draft_ref.path).parent).target
    if recorded.sha256 and (target_sha256 or content_hash(target_ref)) != recorded.sha256:
        raise ModelError(f"the EAGLE-3 head in {draft_ref.spec} was exported for the target "
                         f"{recorded.name!r} at {recorded.path}, and "
                         f"{target_ref.path} is another (its content hash differs); the head "
                         f"reads its target's hidden states: pass that target")


def _check_draft(tokenizer: Any, target_ref: ResolvedModel, draft_ref: ResolvedModel) -> None:
    """Vocabulary, special tokens and chat template must match, before any weights load; an
    EAGLE-3 head reads the target's tokenizer, and must read its vocabulary, hidden size and
    layers."""
    target_config = AutoConfig.from_pretrained(target_ref.path)
    if is_eagle3_dir(draft_ref.path):
        check_eagle3(target_config, head_config(draft_ref.path, target_config))
        check_bundle_target(target_ref, draft_ref)
        return
    check_compatible(tokenizer, load_tokenizer(draft_ref, "draft"), target_config,
                     AutoConfig.from_pretrained(draft_ref.path))
