"""Training rows as they come: the published shape a row is in, and the Example it becomes.

=========== ========================================================= =========================
shape       a row holds                                               as published by
=========== ========================================================= =========================
sharegpt    ``conversations`` of ``{from, value}`` turns, ``from``     ShareGPT dumps; the EAGLE
            human / gpt / system (an optional ``system`` string)      repository and SpecForge
                                                                      train on it
specforge   ``conversations`` of ``{role, content}`` turns (+ ``id``)  SpecForge's prepare_data
                                                                      and regenerate scripts
messages    ``messages`` of ``{role, content}`` turns                  OpenAI chat, UltraChat,
                                                                      most hub chat sets
prompt      ``prompt`` and optionally ``response``                    instruction sets
ids         ``prompt_ids`` and ``response_ids``                       ``draftkit serve --record``
text        ``text``                                                  plain text, ``.txt`` files
=========== ========================================================= =========================

A source's rows are recognised by their shape, or read as the one its ``shape:`` names; a row
of none stops the run with the file, the row and the shapes expected. A chat's turns keep
their order; its last assistant turn is the example's response, and the assistant turns
before it stay in ``messages``, where :mod:`draftkit.data.turns` finds and trains them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from draftkit.errors import DraftkitError

SHAPES = ("sharegpt", "specforge", "messages", "prompt", "ids", "text")

# ShareGPT's speakers, as its dumps name them, and the chat roles they are
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
                  "bing": "assistant", "bard": "assistant", "assistant": "assistant",
                  "system": "system"}

EXPECTED = ("ShareGPT (conversations of from/value turns), SpecForge (conversations of "
            "role/content turns), OpenAI messages (role/content turns), prompt (+ response), "
            "prompt_ids + response_ids, or text")


@dataclass
class Example:
    domain: str
    messages: list[dict[str, str]] | None = None  # chat up to (not including) the response
    response: str | None = None  # the assistant's answer, if the row has one
    reasoning: str | None = None  # ... and its reasoning_content, where the row keeps one
    text: str | None = None  # plain text rows
    origin: str = ""  # "file:row" for error messages
    heldout: bool = True  # may be drawn for the held-out split (its source's ``heldout``)
    document: bool = False  # a whole text file, cut into passages before the held-out split
    prompt_ids: list[int] | None = None  # a prompt already rendered and tokenized
    response_ids: list[int] | None = None  # ... and its answer's ids
    repeat: int = 1  # trained this many times an epoch (its source's ``repeat``)


def row_shape(row: dict) -> str | None:
    """The shape ``row`` is in, by the columns it fills; None where it is in none."""
    turns = row.get("conversations")
    if isinstance(turns, list) and turns:
        first = turns[0] if isinstance(turns[0], dict) else {}
        # Arrow gives every turn the keys of all rows' turns, absent ones None
        if first.get("from") is not None or first.get("value") is not None:
            return "sharegpt"
        return "specforge"
    if row.get("messages"):
        return "messages"
    if row.get("prompt_ids") is not None:
        return "ids"
    if row.get("prompt"):
        return "prompt"
    if row.get("text"):
        return "text"
    return None


def to_example(row: dict, domain: str | None, origin: str, shape: str = "auto") -> Example:
    """One raw row as an Example, read as ``shape`` ('auto': the shape it is in); a row in no
    shape draftkit reads, or not in the one named, is an error naming the row."""
    domain = domain or row.get("domain")
    if not domain:
        raise DraftkitError(f"{origin}: the row has no 'domain' column and its source sets no "
                            f"domain; add domain: NAME to the source")
    found = row_shape(row)
    columns = ", ".join(k for k, v in row.items() if v is not None) or "none"
    if found is None:
        raise DraftkitError(f"{origin}: the row is in none of the shapes draftkit reads (its "
                            f"columns: {columns}); expected {EXPECTED}: rename its columns "
                            f"with the source's columns, or fix the row")
    if shape != "auto" and found != shape:
        raise DraftkitError(f"{origin}: the source's shape is {shape} and this row is "
                            f"{found} (its columns: {columns}); fix the row, or set the "
                            f"source's shape: auto")
    domain = str(domain)
    if found == "sharegpt":
        return _chat(_sharegpt_turns(row, origin), domain, origin)
    if found in ("specforge", "messages"):
        key = "conversations" if found == "specforge" else "messages"
        return _chat(_role_turns(row[key], origin), domain, origin)
    if found == "ids":
        return _ids_example(row, domain, origin)
    row = dict(row)
    for key in ("prompt", "response", "text"):
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            row[key] = str(value)  # a numeric answer (gsm8k-style) is its digits
        elif value is not None and not isinstance(value, str):
            raise DraftkitError(f"{origin}: '{key}' is a {type(value).__name__} "
                                f"({value!r:.40}); it must be a string: fix the row")
    if found == "prompt":
        return Example(domain, messages=[{"role": "user", "content": row["prompt"]}],
                       response=row.get("response") or None, origin=origin)
    return Example(domain, text=row["text"], origin=origin)


def _sharegpt_turns(row: dict, origin: str) -> list[dict[str, str]]:
    """A ShareGPT row's turns as chat messages (its ``system`` string first, if any)."""
    messages = []
    system = row.get("system")
    if isinstance(system, str) and system.strip():
        messages.append({"role": "system", "content": system})
    for j, turn in enumerate(row["conversations"]):
        speaker = turn.get("from") if isinstance(turn, dict) else None
        value = turn.get("value") if isinstance(turn, dict) else None
        if speaker not in SHAREGPT_ROLES or not isinstance(value, str):
            has = _keys(turn)
            what = f"is from {speaker!r}" if isinstance(speaker, str) else f"has {has}"
            raise DraftkitError(f"{origin}: turn {j + 1} {what}; a ShareGPT turn needs 'from' "
                                f"(one of {', '.join(SHAREGPT_ROLES)}) and a 'value' string: "
                                f"fix the row")
        messages.append({"role": SHAREGPT_ROLES[speaker], "content": value})
    return messages


def _role_turns(turns: Any, origin: str) -> list[dict[str, str]]:
    """OpenAI-style turns as chat messages; an assistant turn keeps its ``reasoning_content``
    (SpecForge's regenerated reasoning), which reasoning templates render."""
    messages = []
    for j, m in enumerate(turns):
        # Arrow gives every message the keys of all rows' messages, so absent ones are None.
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)):
            raise DraftkitError(f"{origin}: message {j + 1} has {_keys(m)}; a chat message "
                                f"needs a 'role' and a 'content' string (text only); fix the "
                                f"row")
        message = {"role": m["role"], "content": m["content"]}
        if isinstance(m.get("reasoning_content"), str):
            message["reasoning_content"] = m["reasoning_content"]
        messages.append(message)
    return messages


def _keys(value: Any) -> str:
    if not isinstance(value, dict):
        return type(value).__name__
    return ", ".join(f"{k} ({type(v).__name__})" for k, v in value.items()
                     if v is not None) or "nothing"


def _chat(messages: list[dict[str, str]], domain: str, origin: str) -> Example:
    """A chat as an Example: its last assistant turn is the response, earlier ones stay."""
    speakers = [m["role"] for m in messages if m["role"] != "system"]
    if not speakers or speakers == ["assistant"] * len(speakers):
        raise DraftkitError(f"{origin}: the chat has no user turn for the target to answer; "
                            f"fix the row")
    if speakers[0] == "assistant":
        raise DraftkitError(f"{origin}: the chat opens with an assistant turn, which answers "
                            f"no one; drop that turn from the row")
    if messages[-1]["role"] != "assistant":
        return Example(domain, messages=messages, origin=origin)
    *messages, last = messages
    return Example(domain, messages=messages, response=last["content"],
                   reasoning=last.get("reasoning_content"), origin=origin)


def _ids_example(row: dict, domain: str, origin: str) -> Example:
    """A row of token ids: a rendered prompt and the answer to it, both non-empty."""
    ids = {key: row.get(key) for key in ("prompt_ids", "response_ids")}
    for key, value in ids.items():
        if not (isinstance(value, list) and value and
                all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)):
            raise DraftkitError(f"{origin}: '{key}' must be a non-empty list of token ids "
                                f"(non-negative integers); fix the row")
    return Example(domain, prompt_ids=ids["prompt_ids"], response_ids=ids["response_ids"],
                   origin=origin)
