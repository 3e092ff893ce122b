"""What a recipe will train, sized before any work: ``draftkit distill --dry-run`` prints it.

From the recipe's local data sources (every row read, as training reads them) and the target's
tokenizer and config (from disk only: a hub id's from the local Hugging Face cache): the
examples, their tokens (a sample of them tokenized, the rest scaled by their length in
characters; without a tokenizer, four characters a token, said as an estimate), the packed
rows of ``data.seq_len``, how many times ``max_steps`` goes over them, and the bytes the
teacher cache (``teacher.top_k`` log-probabilities and ids, 6 bytes each, per trained token)
and an EAGLE-3 head's feature cache (three hidden states in bf16 per token) take, and the folder
they go to. A hub-id target not in the local cache is sized offline: its tokens at four
characters each, its hidden size, where it is a target the recipes and guides name, as its
published ``config.json`` gives it (:data:`PUBLISHED_HIDDEN_SIZE`). Where the target answers
the prompts (``data.regime: target``), an answer is sized at ``data.generate.max_new_tokens``:
at most that many tokens each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer

from draftkit.data.sources import load_rows, source_format, to_example
from draftkit.errors import DraftkitError
from draftkit.models import load_tokenizer, resolve_model
from draftkit.models.embedded import cache_root, embedded_config_and_tokenizer
from draftkit.models.facts import text_config

SAMPLE = 200  # examples tokenized to learn tokens per character
CHARS_PER_TOKEN = 4.0  # without a tokenizer
TOO_MANY_PASSES = 5.0
FEATURE_TAPS = 3  # an EAGLE-3 head reads three hidden states
# hidden_size in the published config.json of the hub targets draftkit's recipes and guides
# name, so that a dry run without network sizes their feature cache too
PUBLISHED_HIDDEN_SIZE = {
    "meta-llama/Llama-3.1-8B-Instruct": 4096,
    "meta-llama/Llama-3.3-70B-Instruct": 8192,
    "HuggingFaceTB/SmolLM2-1.7B-Instruct": 2048,
}


@dataclass
class JobSize:
    examples: int
    hub_sources: int  # sources read from the hub when the run starts: not sized
    tokens: int  # every token of every example (prompt and answer)
    trained_tokens: int  # the tokens with a loss (the answers, or every token of text rows)
    estimated: bool  # tokens from characters, without the target's tokenizer
    packed_rows: int
    rows_per_step: int  # per process: batch_size x grad_accum
    passes: float  # max_steps x rows_per_step / packed_rows, per process
    teacher_bytes: int
    feature_bytes: int | None  # None: not an EAGLE-3 head, or the hidden size is not known
    cache: Path
    head: bool = False  # an EAGLE-3 head: its features are cached too


def size_job(cfg, tokenizer=None, hidden_size: int | None = None) -> JobSize:
    """``cfg``'s job, sized (the module's docstring)."""
    examples, hub = [], 0
    for src in cfg.data.sources:
        fmt = source_format(src)
        if fmt == "hub":
            hub += 1
            continue
        for origin, row in load_rows(src, fmt):
            examples.append((to_example(row, src.domain, origin, src.shape), src.repeat))
    generated = cfg.data.regime in ("target", "on_policy")
    per_char = _tokens_per_char([e for e, _ in examples[:SAMPLE]], tokenizer)
    tokens = trained = 0
    for example, repeat in examples:
        prompt, answer = _lengths(example, per_char)
        if generated and example.messages is not None:
            # the target answers every user turn of a chat (draftkit.data.turns)
            users = sum(m["role"] == "user" for m in example.messages)
            answer = cfg.data.generate.max_new_tokens * users
        tokens += repeat * (prompt + answer)
        trained += repeat * (answer if example.text is None else prompt + answer)
    packed = max(1, math.ceil(tokens / cfg.data.seq_len))
    per_step = cfg.train.batch_size * cfg.train.grad_accum
    cached = cfg.teacher.mode == "cache"
    features = None
    if cfg.draft.kind == "eagle3" and hidden_size:
        features = tokens * FEATURE_TAPS * hidden_size * 2
    return JobSize(examples=len(examples), hub_sources=hub, tokens=tokens, trained_tokens=trained,
                   estimated=tokenizer is None, packed_rows=packed, rows_per_step=per_step,
                   passes=cfg.max_steps * per_step / packed,
                   teacher_bytes=trained * cfg.teacher.top_k * 6 if cached else 0,
                   feature_bytes=features if cached else None,
                   cache=Path(cfg.teacher.cache_dir) if cfg.teacher.cache_dir else cache_root(),
                   head=cfg.draft.kind == "eagle3")


def _tokens_per_char(sample, tokenizer) -> float:
    """Tokens per character of the examples' text, from the first ones tokenized."""
    if tokenizer is None:
        return 1.0 / CHARS_PER_TOKEN
    chars = tokens = 0
    for example in sample:
        for text in _texts(example):
            chars += len(text)
            tokens += len(tokenizer(text, add_special_tokens=False)["input_ids"])
    return tokens / chars if chars else 1.0 / CHARS_PER_TOKEN


def _texts(example) -> list[str]:
    texts = [m.get("content") or "" for m in example.messages or []]
    return texts + [t for t in (example.response, example.text) if t]


def _lengths(example, per_char: float) -> tuple[int, int]:
    """(prompt tokens, answer tokens) of one example."""
    if example.prompt_ids is not None:
        return len(example.prompt_ids), len(example.response_ids or [])
    if example.text is not None:
        return round(len(example.text) * per_char), 0
    # a chat's answers are all its assistant turns, each one trained
    turns = example.messages or []
    prompt = sum(len(m.get("content") or "") for m in turns if m["role"] != "assistant")
    answers = sum(len(m.get("content") or "") for m in turns if m["role"] == "assistant")
    return round(prompt * per_char), round((answers + len(example.response or "")) * per_char)


def size_lines(size: JobSize, processes_note: bool = True) -> list[str]:
    """The sizing, a line a fact, and a warning where the data would be gone over too often."""
    about = "about " if size.estimated else ""
    lines = [f"data: {size.examples} examples, {about}{size.tokens:,} tokens "
             f"({about}{size.trained_tokens:,} trained), {size.packed_rows:,} packed rows"
             + (" (tokens estimated at 4 characters each: the target's tokenizer is not on "
                "this machine)" if size.estimated else "")]
    if size.hub_sources:
        lines.append(f"data: {size.hub_sources} hub source(s) not sized (read when the run "
                     f"starts)")
    lines.append(f"steps: {size.rows_per_step} rows a step per process, {size.passes:.1f} "
                 f"passes over the data" + (" per process (each process of a torchrun or "
                                            "DeepSpeed launch adds as many)"
                                            if processes_note else ""))
    if size.teacher_bytes:
        published = " (at the hidden size the target's published config gives: its config " \
            "is not on this machine)" if size.estimated else ""
        feats = "" if not size.head else \
            f" and the feature cache {_bytes(size.feature_bytes)}{published}" \
            if size.feature_bytes else \
            " and the feature cache (not sized: the target's config is not on this machine)"
        lines.append(f"caches: the teacher cache {_bytes(size.teacher_bytes)}{feats}, in "
                     f"{size.cache} (teacher.cache_dir moves them)")
    if size.passes > TOO_MANY_PASSES:
        lines.append(f"warning: max_steps goes over the data {size.passes:.0f} times: the head "
                     f"would learn these examples, not the traffic; train on more data or "
                     f"fewer steps")
    return lines


def _bytes(n: int) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def target_facts(spec: str):
    """(tokenizer, hidden size) of the target, from disk only; for a hub id not in the local
    Hugging Face cache (None, its :data:`PUBLISHED_HIDDEN_SIZE` or None)."""
    try:
        if spec == "embedded":
            config, tokenizer = embedded_config_and_tokenizer()
        elif Path(spec).expanduser().is_dir():
            ref = resolve_model(spec, "target")
            config, tokenizer = AutoConfig.from_pretrained(ref.path), load_tokenizer(ref)
        else:
            config = AutoConfig.from_pretrained(spec, local_files_only=True)
            tokenizer = AutoTokenizer.from_pretrained(spec, local_files_only=True)
    except (OSError, ValueError, DraftkitError):
        return None, PUBLISHED_HIDDEN_SIZE.get(spec)
    return tokenizer, text_config(config).hidden_size
