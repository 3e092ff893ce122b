"""Token ids with response-only loss masks, packed into fixed-length rows per domain.

A chat example is rendered with the target's chat template, exactly as serving will send it;
only the response tokens are trained (the draft never has to predict the user's prompt). A
text example trains on every token. Rows are packed per domain, so each row belongs to one
domain and held-out alpha can be reported per domain.

Masks are stored already shifted: ``loss_mask[t]`` says whether the prediction made at
position t (of token t + 1) counts.

Packed examples do not see each other: ``position_ids`` restart at 0 at every example (and at
the padding), and transformers turns restarting positions into a block-diagonal causal mask
when neither an attention mask nor a KV cache is passed (``use_cache=False``; its
packed-sequence format). The draft is trained, and the
teacher scored, on the context each example has when it is served alone.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import Any

import torch

from draftkit.chat import encode_prompt
from draftkit.data.shapes import Example
from draftkit.data.turns import check_template, has_answers, render_chat
from draftkit.errors import DraftkitError


@dataclass
class Tokenized:
    ids: list[int]
    target: list[bool]  # target[i]: token i is one the draft is trained to predict
    domain: str
    origin: str
    splittable: bool = False  # plain text may be cut into seq_len pieces; a chat may not


@dataclass
class Rows:
    """Fixed-length rows: input_ids (N, T), loss_mask (N, T), domain_ids (N,), position_ids
    (N, T) restarting at each packed example."""

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    domain_ids: torch.Tensor
    domains: list[str]
    position_ids: torch.Tensor | None = None  # None: 0..T-1 in every row (nothing packed)
    # The training prompts (chat-rendered ids) and their domain index, for on-policy steps.
    prompts: list[list[int]] | None = None
    prompt_domains: list[int] | None = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def tokens(self) -> int:
        return int(self.loss_mask.sum())

    def select(self, index: torch.Tensor) -> "Rows":
        """The rows at ``index`` (for evaluating on a sample; prompts are not carried)."""
        return Rows(self.input_ids[index], self.loss_mask[index], self.domain_ids[index],
                    self.domains, None if self.position_ids is None
                    else self.position_ids[index])


def passages(ex: Example, tokenizer: Any, seq_len: int) -> list[Example]:
    """A whole text file (``ex.document``) as runs of whole lines that fit ``seq_len`` tokens,
    so that one file gives held-out passages as well as training ones; any other example as it
    is. A single line longer than that is a passage of its own, which :func:`pack` cuts.
    """
    if not ex.document or ex.text is None:
        return [ex]
    lines = ex.text.splitlines(keepends=True)
    budget = seq_len - len(tokenizer("")["input_ids"])  # room for a BOS the tokenizer adds
    counts = tokenizer(lines, add_special_tokens=False)["input_ids"] if lines else []
    groups: list[list[str]] = [[]]
    used = 0
    for line, ids in zip(lines, counts):
        if groups[-1] and used + len(ids) > budget:
            groups.append([])
            used = 0
        groups[-1].append(line)
        used += len(ids)
    texts = [t for t in map("".join, groups) if t.strip()]
    return [dataclasses.replace(ex, text=t, origin=f"{ex.origin} passage {i + 1}",
                                document=False) for i, t in enumerate(texts)]


def encode_example_prompt(tokenizer: Any, ex: Example) -> list[int]:
    """The ids of a chat or prompt row's prompt, rendered with the target's chat template; a
    row that cannot be rendered is an error naming it."""
    try:
        check_template(tokenizer)
        return encode_prompt(tokenizer, ex.messages)
    except DraftkitError as e:
        raise DraftkitError(f"{ex.origin}: {e}") from None


def tokenize_example(tokenizer: Any, ex: Example, response_only: bool = True,
                     response_ids: list[int] | None = None,
                     prompt: list[int] | None = None,
                     stop_ids: list[int] | None = None) -> Tokenized:
    """Ids and target flags of one example.

    A chat is trained on its assistant turns, where the chat template puts them
    (:func:`draftkit.data.turns.render_chat`): every one of a multi-turn chat. ``response_ids``
    (from a generation cache) are appended to the rendered prompt as they are, so the draft
    learns exactly the tokens the target produced. ``prompt``: the prompt's ids
    (:func:`encode_example_prompt`), when the caller has rendered it already. A turn written
    in the data ends at the first of ``stop_ids`` after it (the target's end-of-turn tokens,
    :func:`draftkit.data.generate.answer_stop_ids`; default: the tokenizer's eos).
    """
    if ex.text is not None:
        ids = tokenizer(ex.text)["input_ids"]
        return Tokenized(list(ids), [True] * len(ids), ex.domain, ex.origin, splittable=True)
    stops = list(stop_ids if stop_ids is not None else [tokenizer.eos_token_id])
    if ex.prompt_ids is not None:  # ids as served: trained as they are, nothing re-rendered
        prompt, response_ids = ex.prompt_ids, response_ids or ex.response_ids
        _check_ids(ex, prompt + response_ids, len(tokenizer))
    try:
        if response_ids is not None:
            if has_answers(ex.messages):  # a multi-turn chat's earlier answers are trained too
                prompt, answered = render_chat(tokenizer, ex.messages, True, stops)
            else:
                if prompt is None:
                    check_template(tokenizer)
                    prompt = encode_prompt(tokenizer, ex.messages)
                answered = [False] * len(prompt)
            ids = prompt + list(response_ids)
            answered = answered + [True] * len(response_ids)
        elif ex.response is not None:
            last = {"role": "assistant", "content": ex.response}
            if ex.reasoning is not None:
                last["reasoning_content"] = ex.reasoning
            ids, answered = render_chat(tokenizer, ex.messages + [last], False, stops)
            if not any(answered):
                raise DraftkitError("the chat template marks no assistant turn in its "
                                    "generation blocks; fix the template")
            # what a template writes after the last turn's end token (ChatML's newline) is
            # never drafted, as decoding stops there, as the target's answers do
            end = max(i for i, a in enumerate(answered) if a) + 1
            ids, answered = ids[:end], answered[:end]
        else:
            raise DraftkitError("a prompt without a response; use data.regime: target to have "
                                "the target answer it")
    except DraftkitError as e:
        raise DraftkitError(f"{ex.origin}: {e}") from None
    target = [(not response_only) or a for a in answered]
    return Tokenized(ids, target, ex.domain, ex.origin)


def _check_ids(ex: Example, ids: list[int], vocab: int) -> None:
    if max(ids) >= vocab:
        raise DraftkitError(f"{ex.origin}: token id {max(ids)} is outside the target's "
                            f"vocabulary of {vocab}; the ids come from another tokenizer")


def pack(examples: list[Tokenized], seq_len: int, pad_id: int, domains: list[str],
         pack: bool = True, truncate: bool = False) -> Rows:
    """Greedy packing of whole examples into rows of ``seq_len``, one domain per row.

    Plain text longer than ``seq_len`` is cut into ``seq_len`` pieces, as in language-model
    pretraining. A chat example longer than ``seq_len`` is an error unless ``truncate``
    (cutting it would drop the response the loss is on). Examples are never split across
    rows, so every row starts at an example boundary.
    """
    pieces = []
    for ex in examples:
        if ex.splittable and len(ex.ids) > seq_len:
            pieces += [Tokenized(ex.ids[i:i + seq_len], ex.target[i:i + seq_len], ex.domain,
                                 ex.origin, True) for i in range(0, len(ex.ids), seq_len)]
        else:
            pieces.append(ex)
    examples = pieces
    cut_bare: list[str] = []  # truncated until nothing of theirs was trained
    rows_ids: list[list[int]] = []
    rows_tgt: list[list[bool]] = []
    rows_dom: list[int] = []
    rows_pos: list[list[int]] = []
    open_row: dict[str, int] = {}  # domain -> index of the row being filled
    for ex in examples:
        ids, tgt = ex.ids, ex.target
        if len(ids) > seq_len:
            if not truncate:
                raise DraftkitError(f"{ex.origin}: {len(ids)} tokens is longer than "
                                    f"data.seq_len={seq_len}; raise data.seq_len (within the "
                                    f"target's context), shorten the row, or set "
                                    f"data.truncate=true")
            ids, tgt = ids[:seq_len], tgt[:seq_len]
            if not any(tgt[1:]):  # the prompt alone fills seq_len: a row that trains nothing
                cut_bare.append(ex.origin)
                continue
        r = open_row.get(ex.domain)
        if not pack or r is None or len(rows_ids[r]) + len(ids) > seq_len:
            rows_ids.append([])
            rows_tgt.append([])
            rows_dom.append(domains.index(ex.domain))
            rows_pos.append([])
            r = open_row[ex.domain] = len(rows_ids) - 1
        # The first token of each packed example has no in-example context to be predicted
        # from, so it is never a target.
        rows_ids[r].extend(ids)
        rows_tgt[r].extend([False] + list(tgt[1:]))
        rows_pos[r].extend(range(len(ids)))
    if cut_bare:
        print(f"draftkit: {len(cut_bare)} example(s) left out: their prompt fills "
              f"data.seq_len={seq_len}, so data.truncate would leave no response to train on "
              f"(first: {cut_bare[0]}); raise data.seq_len to keep them", file=sys.stderr,
              flush=True)
    if not rows_ids:
        raise DraftkitError("no rows to pack; the dataset is empty" if not cut_bare else
                            f"no rows to pack: every example's prompt fills data.seq_len="
                            f"{seq_len}; raise data.seq_len")
    n = len(rows_ids)
    input_ids = torch.full((n, seq_len), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((n, seq_len), dtype=torch.bool)
    # padding is one more segment of its own, so it restarts positions too
    position_ids = torch.arange(seq_len).repeat(n, 1)
    for i, (ids, tgt, pos) in enumerate(zip(rows_ids, rows_tgt, rows_pos)):
        input_ids[i, :len(ids)] = torch.tensor(ids)
        # shift: the logits at t predict token t + 1
        loss_mask[i, :len(ids) - 1] = torch.tensor(tgt[1:], dtype=torch.bool)
        position_ids[i, :len(ids)] = torch.tensor(pos)
        position_ids[i, len(ids):] = torch.arange(seq_len - len(ids))
    return Rows(input_ids, loss_mask, torch.tensor(rows_dom), list(domains),
                position_ids=position_ids)


def positions(rows: Rows, index: torch.Tensor | slice) -> torch.Tensor:
    """position_ids of the selected rows (B, T)."""
    if rows.position_ids is not None:
        return rows.position_ids[index]
    ids = rows.input_ids[index]
    return torch.arange(ids.shape[1]).expand_as(ids)
