"""Multi-turn chats: where the chat template puts each assistant turn, and the target's own
answers to every user turn.

A chat is trained as the target's chat template renders it, on its assistant turns only.
Where the template marks them itself (``{% generation %}`` blocks, which transformers'
``return_assistant_tokens_mask`` reads), its marks are the mask. Most templates do not (Llama
3's and Qwen3's among them), so each assistant turn is found by rendering the chat up to it:
the turns before it with the assistant header a generation prompt adds are where its tokens
start (the first token the two renderings disagree on), and its end-of-turn token, where
decoding stops and which the draft must learn to propose, is where they end. A template that
writes a turn otherwise once more follow it still starts that turn where the renderings part
(Qwen3 drops the reasoning of the answers before the last user turn, and with thinking off
its header holds an empty think block that earlier answers lack); one that rewrites the turns
*before* an answer is refused, naming the row, rather than trained on a guessed mask.

:func:`answer_every_turn` has the target answer each user turn before a chat's last in order,
its own earlier answers as the history, as a served conversation goes: the data's answers were
written by people or other models, and the draft will draft the target's.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

from draftkit.chat import apply_template, encode_prompt
from draftkit.data.shapes import Example
from draftkit.errors import DraftkitError

# a ``{% generation %}`` block: the template marks its assistant turns itself
_GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")


def has_answers(messages: list[dict[str, str]] | None) -> bool:
    """Whether a chat's history holds assistant turns (a multi-turn chat's earlier answers)."""
    return any(m["role"] == "assistant" for m in messages or [])


def check_template(tokenizer: Any) -> None:
    """A target without a chat template renders no chat: one line saying what to give."""
    if not getattr(tokenizer, "chat_template", None):
        raise DraftkitError("the target's tokenizer has no chat template, so prompt and chat "
                            "rows cannot be rendered; give 'text' rows")


def render_chat(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool,
                stop_ids: list[int]) -> tuple[list[int], list[bool]]:
    """The ids of ``messages`` as the chat template renders them, and for each id whether it
    is a token of an assistant turn (its first token through its end-of-turn token, the
    first of ``stop_ids`` after it)."""
    check_template(tokenizer)
    template = tokenizer.get_chat_template()
    if _GENERATION_BLOCK.search(template):
        return _marked(tokenizer, messages, add_generation_prompt, set(stop_ids))
    ids = _encode(tokenizer, apply_template(tokenizer, messages, add_generation_prompt))
    mask = [False] * len(ids)
    end = 0  # where the previous assistant turn ended
    for j, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        turn = sum(m["role"] == "assistant" for m in messages[:j]) + 1
        before = [] if messages[j - 1]["role"] == "assistant" else \
            _encode(tokenizer, apply_template(tokenizer, messages[:j], False))
        head = _encode(tokenizer, apply_template(tokenizer, messages[:j], True))
        start = _common_prefix(head, ids)
        if start < end or ids[:len(before)] != before:
            raise DraftkitError(f"the chat template writes the turns before assistant turn "
                                f"{turn} otherwise once that turn follows them, so where each "
                                f"turn lies is unknown; give the chat as single-turn rows")
        stop = next((i for i in range(start, len(ids)) if ids[i] in stop_ids), None)
        if stop is None:  # no end-of-turn token: the turn runs to where the next one starts
            through = _encode(tokenizer, apply_template(tokenizer, messages[:j + 1], False))
            stop = _common_prefix(through, ids) - 1
            if stop < start:
                raise DraftkitError(f"assistant turn {turn} has no end-of-turn token (ids "
                                    f"{sorted(stop_ids)}) in the chat template's rendering; "
                                    f"give the chat as single-turn rows")
        mask[start:stop + 1] = [True] * (stop + 1 - start)
        end = stop + 1
    return ids, mask


def _marked(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool,
            stops: set[int]) -> tuple[list[int], list[bool]]:
    """The template's own assistant marks, each run through the end-of-turn token after it."""
    try:
        out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True,
                                            add_generation_prompt=add_generation_prompt)
    except Exception as e:
        raise DraftkitError(f"the chat template cannot render these messages "
                            f"({type(e).__name__}: {e})") from None
    ids = list(out["input_ids"])
    mask = [bool(m) for m in out["assistant_masks"]]
    for i in range(1, len(ids)):  # a block that closes before the end token leaves it out
        if mask[i - 1] and not mask[i] and ids[i] in stops:
            mask[i] = True
    return ids, mask


def _encode(tokenizer: Any, text: str) -> list[int]:
    # the template's text holds its special tokens already
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def answer_every_turn(examples: list[Example], tokenizer: Any, generate: Callable,
                      temperature: float, seed: int, stop_ids: list[int]) -> list[Example]:
    """``examples`` with each multi-turn chat's history answered by the target: the data's
    assistant turns dropped, and after every user turn before the last the target's answer to
    the chat so far. One ``generate(prompts_ids, temperature, seed)`` call a round, every
    chat's next turn in it; the last user turn is left for the caller to have answered.
    Other examples are returned as they are."""
    rest: dict[int, list[dict[str, str]]] = {}  # chat -> its turns not yet in its history
    history: dict[int, list[dict[str, str]]] = {}
    for i, ex in enumerate(examples):
        turns = [m for m in ex.messages or [] if m["role"] != "assistant"]
        if sum(m["role"] == "user" for m in turns) > 1:
            rest[i], history[i] = turns, []
    while True:
        prompts = {}
        for i, turns in rest.items():
            users = [j for j, m in enumerate(turns) if m["role"] == "user"]
            if len(users) < 2:  # the last user turn: the caller's to answer
                continue
            history[i] += turns[:users[0] + 1]
            rest[i] = turns[users[0] + 1:]
            try:
                prompts[i] = encode_prompt(tokenizer, history[i])
            except DraftkitError as e:
                raise DraftkitError(f"{examples[i].origin}: {e}") from None
        if not prompts:
            break
        for i, answer in zip(prompts, generate(list(prompts.values()), temperature, seed)):
            history[i].append({"role": "assistant", "content": answer_text(tokenizer, answer,
                                                                           stop_ids)})
    return [dataclasses.replace(ex, messages=history[i] + rest[i], response=None,
                                reasoning=None) if i in rest else ex
            for i, ex in enumerate(examples)]


def answer_text(tokenizer: Any, ids: list[int], stop_ids: list[int]) -> str:
    """An answer's text as a client sends it back in the history: its end-of-turn token
    dropped, any other token (a reasoning block's tags) kept."""
    if ids and ids[-1] in stop_ids:
        ids = ids[:-1]
    return tokenizer.decode(ids)
