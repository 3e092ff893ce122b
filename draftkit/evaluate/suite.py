"""Domain evaluation suites: prompts grouped by domain, read from JSONL.

A suite is a JSONL file, or a folder of them (``*.jsonl``, read in sorted order), one prompt
per line, either as text or as OpenAI-style messages ending with a user turn::

    {"domain": "code", "prompt": "Write a Python function that reverses a string."}
    {"domain": "chat", "messages": [{"role": "user", "content": "..."}, ...]}

Acceptance rate depends on the domain (code and math are far more predictable than creative
writing), so results are always reported per domain. The shipped suites live in
``eval/suites/`` (shipped in the package) and are never used for training; ``eval/train_prompts/``
holds the training-side prompts, disjoint from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from draftkit.chat import Prompt
from draftkit.errors import DraftkitError
from draftkit.io import read_jsonl
from draftkit.resources import shared

_ROW_KEYS = ("domain", "prompt", "messages")
_MESSAGE_KEYS = ("role", "content")
_ROLES = ("system", "user", "assistant")
_EXAMPLE = '{"domain": "code", "prompt": "..."}'


@dataclass(frozen=True)
class SuiteRow:
    """One evaluation prompt."""

    domain: str  # e.g. "code", "math"; results are grouped by it
    prompt: Prompt  # plain text, or messages rendered with the target's chat template
    source: str  # "file:line" it was read from, for error messages and reports


def builtin_suites_dir() -> Path:
    """The shipped suites, ``eval/suites/`` (packaged: :mod:`draftkit.resources`)."""
    return shared("eval", "suites")


def builtin_train_prompts_dir() -> Path:
    """The shipped distillation prompts, ``eval/train_prompts/``; disjoint from the suites."""
    return shared("eval", "train_prompts")


def load_suite(path: str | Path, limit: int | None = None,
               domains: list[str] | None = None) -> list[SuiteRow]:
    """Rows of a JSONL suite file or folder, in file order.

    ``domains`` keeps only those domains (each must be present); ``limit`` keeps the first
    ``limit`` rows of each domain.
    """
    if limit is not None and limit <= 0:
        raise DraftkitError(f"the suite limit must be a positive number of prompts per domain, "
                            f"got {limit}")
    rows = [row for file in _suite_files(Path(path)) for row in _read_file(file)]
    if domains is not None:
        present = list(by_domain(rows))
        missing = [d for d in domains if d not in present]
        if missing:
            raise DraftkitError(f"{path}: no prompts for domain(s) {', '.join(missing)}; the "
                                f"suite has {', '.join(present)}")
        rows = [row for row in rows if row.domain in domains]
    if limit is not None:
        taken: dict[str, int] = {}
        kept = []
        for row in rows:  # one pass keeps file order across domains
            if taken.get(row.domain, 0) < limit:
                taken[row.domain] = taken.get(row.domain, 0) + 1
                kept.append(row)
        rows = kept
    return rows


def by_domain(rows: list[SuiteRow]) -> dict[str, list[SuiteRow]]:
    """Rows grouped by domain; domains and rows keep their first-seen order."""
    groups: dict[str, list[SuiteRow]] = {}
    for row in rows:
        groups.setdefault(row.domain, []).append(row)
    return groups


def _suite_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.glob("*.jsonl") if p.is_file())
        if not files:
            raise DraftkitError(f"{path}: the suite folder has no *.jsonl files; add one with "
                                f"lines like {_EXAMPLE}")
        return files
    if path.is_file():
        return [path]
    raise DraftkitError(f"{path}: no such suite file or folder; pass a .jsonl file or a folder "
                        f"of them")


def _read_file(file: Path) -> list[SuiteRow]:
    rows = [_parse_row(obj, source) for source, obj in read_jsonl(
        file, "suite file", f"save the suite as UTF-8 JSONL, one object per line like {_EXAMPLE}")]
    if not rows:
        raise DraftkitError(f"{file}: the suite file has no prompts; add lines like {_EXAMPLE}")
    return rows


def _parse_row(obj, source: str) -> SuiteRow:
    def bad(what: str) -> DraftkitError:
        return DraftkitError(f"{source}: {what}")

    _check_object(obj, "a row", f"a JSON object like {_EXAMPLE}", _ROW_KEYS,
                  "a row has 'domain' and one of 'prompt' or 'messages'", bad)
    domain = obj.get("domain")
    if not isinstance(domain, str) or not domain.strip():
        raise bad("missing or empty 'domain'; give the domain name, e.g. \"code\"")
    if ("prompt" in obj) == ("messages" in obj):
        raise bad("a row needs exactly one of 'prompt' (text) or 'messages' (a chat)")
    if "prompt" in obj:
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise bad("empty 'prompt'; give the prompt text")
        return SuiteRow(domain, prompt, source)
    return SuiteRow(domain, _check_messages(obj["messages"], bad), source)


def _check_object(value, name: str, like: str, keys, has: str, bad) -> None:
    """``value`` is a JSON object with only ``keys``, or ``bad`` says which it is not."""
    if not isinstance(value, dict):
        raise bad(f"{name} must be {like}, got {type(value).__name__}")
    unknown = [k for k in value if k not in keys]
    if unknown:
        raise bad(f"{name} has unknown key {unknown[0]!r}; {has}")


def _check_messages(messages, bad) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list of {\"role\", \"content\"} objects")
    for i, m in enumerate(messages):
        _check_object(m, f"messages[{i}]", "a {\"role\", \"content\"} object", _MESSAGE_KEYS,
                      "a message has 'role' and 'content'", bad)
        if m.get("role") not in _ROLES:
            raise bad(f"messages[{i}] has role {m.get('role')!r}; use one of "
                      f"{', '.join(_ROLES)}")
        if not isinstance(m.get("content"), str) or not m["content"].strip():
            raise bad(f"messages[{i}] has missing or empty 'content'; give the message text")
    # The target answers the last turn, so an eval chat must end with the user speaking.
    if messages[-1]["role"] != "user":
        raise bad("the last message must have role 'user' (the target answers it)")
    return messages
