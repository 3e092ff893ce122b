"""The draft a recipe trains: built from the recipe (a model, some of the target's layers, or a
smaller random-init model), its frozen parts, its reduced vocabulary (FR-Spec) and its export
as a plain HF model folder.

    draft = build_draft(cfg, target, tokenizer, target_ref)   # float32, frozen parts set
    export_draft(draft, tokenizer, out / "best", head)       # LoRA merged, one rename
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig

from draftkit.data import Rows
from draftkit.distill.config import DistillConfig
from draftkit.errors import DraftkitError
from draftkit.extras import require
from draftkit.io import atomic_write_json
from draftkit.models import check_compatible, load_model, load_tokenizer, resolve_model
from draftkit.models.derive import derive_by_layers, derive_random, save_draft
from draftkit.models.facts import context_window
from draftkit.models.reduced_head import ReducedHead


def build_draft(cfg: DistillConfig, target: Any, tokenizer: Any, target_ref: Any) -> Any:
    """The draft named by the recipe, or derived from the target; in float32 for training."""
    d = cfg.draft
    if d.model is not None:
        ref = resolve_model(d.model, "draft")

        # A vocabulary or special-token mismatch is caught here, before any training.
        check_compatible(tokenizer, load_tokenizer(ref, "draft"),
                         AutoConfig.from_pretrained(target_ref.path),
                         AutoConfig.from_pretrained(ref.path))
        draft = load_model(ref, "draft", device="cpu", dtype="float32")
    elif d.derive_layers is not None:
        draft = derive_by_layers(target, d.derive_layers)
    else:
        draft = derive_random(target, d.num_layers, d.hidden_size, d.intermediate_size, cfg.seed)
    draft = draft.float()
    apply_freeze(draft, d.freeze)
    if d.lora.enabled:
        require("train", "LoRA training", ("peft",))
        from peft import LoraConfig, get_peft_model  # optional extra: train

        draft = get_peft_model(draft, LoraConfig(
            task_type="CAUSAL_LM", r=d.lora.r, lora_alpha=d.lora.alpha,
            lora_dropout=d.lora.dropout, target_modules=list(d.lora.target_modules)))
    return draft


def apply_freeze(model: Any, parts: list[str]) -> None:
    """Freeze named parts; a name that matches nothing is an error (a typo trains everything)."""
    for part in parts:
        if part == "embeddings":
            params = [model.get_input_embeddings().weight]
        elif part == "head":
            params = [model.get_output_embeddings().weight]
        elif part == "norm":
            params = [p for n, p in model.named_parameters()
                      if n.endswith("norm.weight") and ".layers." not in n]
        else:
            params = [p for n, p in model.named_parameters() if part in n]
        if not params:
            raise DraftkitError(f"draft.freeze: '{part}' matches no parameter of the draft; "
                                f"use embeddings, head, norm or a parameter-name substring")
        for p in params:
            p.requires_grad_(False)


def export_draft(draft: Any, tokenizer: Any, path: Path, head: ReducedHead | None = None,
                 row: dict | None = None) -> Path:
    """Write ``path`` as a plain HF model folder; LoRA adapters are merged first. ``head``:
    the reduced head to store in it (``draft_vocab.json``); ``row``: the evaluation that
    chose it, as ``best.json``. All of it lands in one rename, so a kill never leaves weights
    without their vocabulary or evaluation."""
    model = draft
    if hasattr(draft, "merge_and_unload"):  # a peft model: serving engines take no adapters
        model = copy.deepcopy(draft).merge_and_unload()

    def also(folder: Path) -> None:
        if head is not None:
            head.save(folder)
        if row is not None:
            atomic_write_json(folder / "best.json", row)

    return save_draft(model, tokenizer, path, force=True, also=also)


def token_counts(rows: Rows, vocab_size: int) -> torch.Tensor:
    """(V,) how often each token is the next token at the trained positions of ``rows``."""
    nxt = rows.input_ids.roll(-1, dims=1)[rows.loss_mask]
    return torch.bincount(nxt, minlength=vocab_size)


def choose_draft_vocab(size: int, train_rows: Rows, heldout: Rows, tokenizer: Any,
                       vocab_size: int) -> ReducedHead:
    """The reduced head of the ``size`` tokens the target emits most in the training rows
    (what the draft will be asked to propose), covering its share of the held-out rows'
    tokens."""
    special = list(tokenizer.all_special_ids) + [tokenizer.eos_token_id]
    head = ReducedHead.choose(token_counts(train_rows, vocab_size), size,
                              always=[i for i in special if i is not None])
    head.covered = head.coverage(token_counts(heldout, vocab_size))
    head.source = f"target tokens of {len(train_rows)} training rows"
    return head


def check_context(config: Any, seq_len: int, role: str) -> None:
    """Packed rows of ``seq_len`` tokens must fit the position embeddings of a model of
    ``config`` (its HF config: the dry run checks before any weights load)."""
    context = context_window(config)
    if context and seq_len > context:
        raise DraftkitError(f"data.seq_len={seq_len} is longer than the {role}'s context "
                            f"window ({context}); lower data.seq_len")
