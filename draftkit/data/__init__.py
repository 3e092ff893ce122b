"""Training data for distillation: rows -> examples -> (generated responses) -> packed rows.

- :mod:`draftkit.data.sources`: files / hub datasets through ``datasets``, with a domain;
- :mod:`draftkit.data.shapes`: the row shapes read (ShareGPT, SpecForge, OpenAI messages,
  prompt / response, token ids, text), each row an :class:`Example`;
- :mod:`draftkit.data.generate`: the target's responses to prompts, cached and resumable;
- :mod:`draftkit.data.turns`: multi-turn chats: each assistant turn where the template puts
  it, and the target's own answers to every user turn;
- :mod:`draftkit.data.pack`: chat-template rendering, assistant-only masks, packing.

:func:`build_rows` ties them together for a recipe's ``data`` section.
"""

from __future__ import annotations

import datetime
import json
import random
import re
from pathlib import Path
from typing import Any, Callable

from draftkit.data.pack import (Rows, Tokenized, encode_example_prompt, pack, passages, positions,
                                tokenize_example)
from draftkit.data.sources import Example, load_examples
from draftkit.data.turns import answer_every_turn
from draftkit.errors import DraftkitError
from draftkit.models.embedded import cache_root

__all__ = ["Example", "Rows", "Tokenized", "build_rows", "load_examples", "pack", "passages",
           "positions", "split_heldout", "tokenize_example"]


def split_heldout(by_domain: dict[str, list[Example]], per_domain: int,
                  seed: int) -> tuple[list[Example], list[Example]]:
    """(train, heldout): ``per_domain`` prompts of every domain held out, chosen by ``seed``.

    The draw is by prompt: one example of each drawn prompt is held out, and no example with
    that prompt (another answer to it, a duplicate row, a copy in another source or domain) is
    trained on, so held-out alpha is measured on prompts the draft has never seen. Only prompts
    of examples whose source allows it (``heldout: true``, the default) are drawn, so adding a
    train-only source leaves the held-out rows as they were.
    """
    drawn = {}  # domain -> its eligible examples grouped by prompt, in draw order
    for domain, examples in by_domain.items():
        groups = _by_prompt([ex for ex in examples if ex.heldout])
        total = len(_by_prompt(examples))
        if len(groups) < per_domain or total <= per_domain:
            raise DraftkitError(f"domain '{domain}' has {len(groups)} rows that may be held "
                                f"out and {total} in all (rows with the same prompt count "
                                f"once), not enough to hold out data.heldout_per_domain="
                                f"{per_domain} and train on the rest; add rows or lower "
                                f"data.heldout_per_domain")
        random.Random(f"{seed}:{domain}").shuffle(groups)
        drawn[domain] = groups
    heldout = [group[0] for groups in drawn.values() for group in groups[:per_domain]]
    held_prompts = {_prompt_of(ex) for ex in heldout}
    train = []
    for domain, examples in by_domain.items():
        kept = [ex for group in drawn[domain][per_domain:] for ex in group] + \
            [ex for ex in examples if not ex.heldout]
        train += [ex for ex in kept if _prompt_of(ex) not in held_prompts]
    return train, heldout


def _prompt_of(ex: Example) -> str:
    """What an example asks (its chat up to the response, or its text), as a comparable key."""
    return json.dumps({"messages": ex.messages, "text": ex.text, "ids": ex.prompt_ids},
                      sort_keys=True)


def _by_prompt(examples: list[Example]) -> list[list[Example]]:
    """``examples`` grouped by prompt, groups in order of first appearance."""
    groups: dict[str, list[Example]] = {}
    for ex in examples:
        groups.setdefault(_prompt_of(ex), []).append(ex)
    return list(groups.values())


def build_rows(data: Any, tokenizer: Any, seed: int, generate: Callable | None = None,
               stop_ids: list[int] | None = None) -> tuple[Rows, Rows]:
    """Packed (train, heldout) rows for a recipe's ``data`` section.

    ``generate(prompts_ids, temperature, seed) -> response_ids`` answers prompts with the target
    (regimes 'target' and 'on_policy'); it is only called when the recipe asks for it. With
    ``data.generate.extra_samples`` the training prompts get that many more sampled answers,
    each a further training example of the same prompt. ``stop_ids``: where the target's turn
    ends (:func:`draftkit.data.generate.answer_stop_ids`), which ends responses written in the
    data too.
    """
    tokenizer = _TrainingRender(tokenizer, data.enable_thinking)
    by_domain = {domain: [p for ex in examples for p in passages(ex, tokenizer, data.seq_len)]
                 for domain, examples in load_examples(data.sources).items()}
    domains = list(by_domain)
    train, heldout = split_heldout(by_domain, data.heldout_per_domain, seed)
    examples = train + heldout
    responses: list[list[int] | None] = [None] * len(examples)
    prompts: dict[int, list[int]] = {}
    if data.regime in ("target", "on_policy"):
        if all(ex.messages is None for ex in examples):
            raise DraftkitError(f"data.regime: {data.regime} needs prompts (chat or 'prompt' "
                                f"rows); the sources hold only text")
        if generate is None:
            raise DraftkitError("target-generated data needs the target model")
        g = data.generate
        # a chat's earlier turns answered by the target first, so that its history is what
        # a served conversation's would be
        examples = answer_every_turn(examples, tokenizer, generate, g.temperature, seed,
                                     stop_ids or [tokenizer.eos_token_id])
        train, heldout = examples[:len(train)], examples[len(train):]
        prompts = {i: encode_example_prompt(tokenizer, ex) for i, ex in enumerate(examples)
                   if ex.messages is not None}
        answers = generate(list(prompts.values()), g.temperature, seed)
        for i, ans in zip(prompts, answers):
            responses[i] = ans
    n = len(train)
    # Held-out alpha is measured where a draft drafts: on responses, whatever the loss covers.
    tokens = [tokenize_example(tokenizer, ex, data.response_only or i >= n, responses[i],
                               prompts.get(i), stop_ids) for i, ex in enumerate(examples)]
    train_prompts = [i for i in sorted(prompts) if i < n]  # example indices
    extra = _extra_answers(data, tokenizer, [(train[i], prompts[i]) for i in train_prompts],
                           seed, generate, stop_ids)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else \
        tokenizer.eos_token_id
    # a source's ``repeat`` weighs it: its rows enter the epoch that many times, each copy a
    # pass of its own over the data, so copies are packed beside other rows
    passes = max((ex.repeat for ex in train), default=1)
    trained = [t for r in range(passes) for ex, t in zip(train, tokens[:n]) if ex.repeat > r]
    train_rows = pack(trained + extra, data.seq_len, pad_id, domains, data.pack, data.truncate)
    train_rows.prompts = [prompts[i] for i in train_prompts]
    train_rows.prompt_domains = [domains.index(examples[i].domain) for i in train_prompts]
    # Held-out rows are never packed together: alpha is a mean over whole examples.
    heldout_rows = pack(tokens[n:], data.seq_len, pad_id, domains, False, data.truncate)
    scored = {domains[d] for d in heldout_rows.domain_ids.tolist()}
    lost = [d for d in dict.fromkeys(ex.domain for ex in heldout) if d not in scored]
    if lost:  # else alpha/<domain> would quietly go missing
        raise DraftkitError(f"domain '{lost[0]}' has no held-out row left: data.truncate cut "
                            f"every one to its prompt; raise data.seq_len")
    return train_rows, heldout_rows


def _extra_answers(data: Any, tokenizer: Any, train: list[tuple[Example, list[int]]],
                   seed: int, generate: Callable | None,
                   stop_ids: list[int] | None = None) -> list[Tokenized]:
    """``extra_samples`` sampled answers to every training (example, prompt ids), as further
    examples.

    A sampled answer is a new context; forward KL scores each of its positions with the target's
    whole distribution, where cross-entropy sees one draw (DistillSpec, arXiv 2310.08461, on
    target-generated data).
    """
    g = data.generate
    if not g.extra_samples or not train:
        return []
    out = []
    for j in range(g.extra_samples):
        # a seed of its own per draw; never ``seed``, which sampled the first answers unless
        # they are greedy
        draw_seed = seed + 1 + j if g.temperature > 0 else seed + j
        answers = generate([p for _, p in train], g.extra_temperature, draw_seed)
        out += [tokenize_example(tokenizer, ex, data.response_only, ans, prompt, stop_ids)
                for (ex, prompt), ans in zip(train, answers)]
    return out


# The day training prompts are rendered on, whatever today is: Llama 3.x chat templates print
# the date into the system header, which would change the prompts, their cached answers and the
# data key of a run resumed on another day. They take it from ``date_string`` where one is given;
# templates that call ``strftime_now`` directly (Mistral's) get a ``strftime_now`` macro of the
# same name that formats this day instead of today.
TRAINING_DAY = datetime.date(2024, 7, 26)
TRAINING_DATE = "26 Jul 2024"  # TRAINING_DAY as Llama 3.x's templates write it
_STRFTIME_CALL = re.compile(r"strftime_now\(\s*(['\"])(.*?)\1\s*\)")


def fixed_date_template(template: str) -> str:
    """``template`` with a ``strftime_now`` of its own ahead of it, which formats
    ``TRAINING_DAY``: a template's macro hides the renderer's global of the same name. The
    formats are the literal ones the template passes (transformers' sandbox turns a Python
    callable passed in into an inert string, so the macro looks each one up in a table); any
    other gets today's date, as without the macro."""
    if "strftime_now" not in template:
        return template
    table = json.dumps({f: TRAINING_DAY.strftime(f) for _, f in _STRFTIME_CALL.findall(template)})
    # a format the table lacks (a variable's) falls back to the renderer's own, today's date;
    # trim_blocks eats one newline after the macro's last tag: give it one of its own
    return ("{%- set draftkit_strftime_now = strftime_now %}"
            "{%- macro strftime_now(format) -%}{{ " + table + "[format] if format in " + table
            + " else draftkit_strftime_now(format) }}{%- endmacro %}\n" + template)


class _TrainingRender:
    """A tokenizer whose chat template renders as training needs: on ``TRAINING_DAY``, and
    with the recipe's reasoning mode (``data.enable_thinking``, where it sets one; a template
    that never reads it is an error, not a setting silently ignored). All else is its own."""

    def __init__(self, tokenizer: Any, enable_thinking: bool | None = None):
        self._tokenizer = tokenizer
        self._kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        template = getattr(tokenizer, "chat_template", None)
        if self._kwargs and "enable_thinking" not in str(template or ""):
            raise DraftkitError("data.enable_thinking is set, and the target's chat template "
                                "has no reasoning mode (it never reads enable_thinking); "
                                "remove data.enable_thinking")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._tokenizer(*args, **kwargs)

    def __len__(self) -> int:
        return len(self._tokenizer)

    def apply_chat_template(self, conversation: Any, *args: Any, chat_template: str | None = None,
                            **kwargs: Any) -> Any:
        template = self._tokenizer.get_chat_template(chat_template, kwargs.get("tools"))
        return self._tokenizer.apply_chat_template(
            conversation, *args, chat_template=fixed_date_template(template),
            date_string=TRAINING_DATE, **self._kwargs, **kwargs)


def default_generation_dir() -> Path:
    """Generated answers are keyed by target, settings and prompt, so runs share them."""
    return cache_root() / "generated"
