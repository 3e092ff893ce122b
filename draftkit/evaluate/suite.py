"""Domain evaluation suites: prompts grouped by domain, read from JSONL.

A suite is a JSONL file (gzipped too), or a folder of them (``*.jsonl`` and ``*.jsonl.gz``,
read in sorted order), one prompt per line. Its rows are draftkit's own, as text or as
OpenAI-style messages ending with a user turn::

    {"domain": "code", "prompt": "Write a Python function that reverses a string."}
    {"domain": "chat", "messages": [{"role": "user", "content": "..."}, ...]}

or a public benchmark's question file as its project publishes it, recognised by its shape:

- MT-Bench's ``question.jsonl`` (``question_id``, ``category``, ``turns``) and Spec-Bench's
  (the same shape, MT-Bench's 80 questions and its own categories beside them): each
  question's first turn, its category the domain (:func:`with_later_turns` adds the later
  turns, after the target's own answers);
- HumanEval (``task_id``, ``prompt``, ``entry_point``, ...; ``HumanEval.jsonl.gz``): the
  prompt, domain "code";
- GSM8K (``question``, ``answer``): the question, domain "math".

Acceptance rate depends on the domain (code and math are far more predictable than creative
writing), so results are always reported per domain, and a report names the benchmark its
rows came from. The shipped suites live in ``eval/suites/`` (shipped in the package) and are
never used for training; ``eval/train_prompts/`` holds the training-side prompts, disjoint from
them. Nothing is downloaded: a benchmark's file is the user's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from draftkit.chat import Prompt
from draftkit.errors import DraftkitError
from draftkit.io import read_jsonl
from draftkit.resources import shared

_ROW_KEYS = ("domain", "prompt", "messages")
_MESSAGE_KEYS = ("role", "content")
_ROLES = ("system", "user", "assistant")
_EXAMPLE = '{"domain": "code", "prompt": "..."}'


# MT-Bench's categories; a question file with others is Spec-Bench's
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction",
                       "stem", "humanities")
_SHAPES = ("draftkit's own (domain with prompt or messages), MT-Bench or Spec-Bench "
           "(question_id, category, turns), HumanEval (task_id, prompt, entry_point) or GSM8K "
           "(question, answer)")


@dataclass(frozen=True)
class SuiteRow:
    """One evaluation prompt."""

    domain: str  # e.g. "code", "math"; results are grouped by it
    prompt: Prompt  # plain text, or messages rendered with the target's chat template
    source: str  # "file:line" it was read from, for error messages and reports
    benchmark: str | None = None  # the public benchmark it is from; None: draftkit's own row
    later_turns: tuple[str, ...] = ()  # a benchmark question's turns after the first


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


def benchmark_of(rows: list[SuiteRow], every_turn: bool = False) -> str | None:
    """The public benchmark(s) ``rows`` come from, as a report names them, saying which turns
    of multi-turn questions were measured (``every_turn``: :func:`with_later_turns`); None for
    draftkit's own rows."""
    names = list(dict.fromkeys(r.benchmark for r in rows if r.benchmark))
    if any(r.later_turns for r in rows):
        names = [f"{n} ({'every turn' if every_turn else 'first turns'})" for n in names]
    return " + ".join(names) or None


def with_later_turns(rows: list[SuiteRow],
                     answer: Callable[[list[list[dict[str, str]]]], list[str]]
                     ) -> list[SuiteRow]:
    """``rows`` and, after them, each multi-turn question's later turns as prompts of their
    own, each following the target's answers to the turns before it, as MT-Bench's answers are
    generated. ``answer(chats)``: the target's answer text to each chat, a call a turn."""
    out = list(rows)
    chats = {i: [{"role": "user", "content": r.prompt}] for i, r in enumerate(rows)
             if r.later_turns}
    turn = 0
    while live := {i: c for i, c in chats.items() if turn < len(rows[i].later_turns)}:
        for i, text in zip(live, answer(list(live.values()))):
            row = rows[i]
            live[i] += [{"role": "assistant", "content": text},
                        {"role": "user", "content": row.later_turns[turn]}]
            out.append(SuiteRow(row.domain, list(live[i]), f"{row.source} turn {turn + 2}",
                                row.benchmark))
        turn += 1
    return out


def by_domain(rows: list[SuiteRow]) -> dict[str, list[SuiteRow]]:
    """Rows grouped by domain; domains and rows keep their first-seen order."""
    groups: dict[str, list[SuiteRow]] = {}
    for row in rows:
        groups.setdefault(row.domain, []).append(row)
    return groups


def _suite_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in [*path.glob("*.jsonl"), *path.glob("*.jsonl.gz")]
                       if p.is_file())
        if not files:
            raise DraftkitError(f"{path}: the suite folder has no *.jsonl files; add one with "
                                f"lines like {_EXAMPLE}")
        return files
    if path.is_file():
        return [path]
    raise DraftkitError(f"{path}: no such suite file or folder; pass a .jsonl file or a folder "
                        f"of them")


def _read_file(file: Path) -> list[SuiteRow]:
    objs = read_jsonl(file, "suite file", f"save the suite as UTF-8 JSONL, one object per line "
                                          f"like {_EXAMPLE}")
    if not objs:
        raise DraftkitError(f"{file}: the suite file has no prompts; add lines like {_EXAMPLE}")
    shape = _shape(*objs[0])
    for source, obj in objs[1:]:  # one file, one benchmark
        if _shape(source, obj) != shape:
            raise DraftkitError(f"{source}: a {_shape(source, obj)} row in a {shape} file; a "
                                f"suite file holds rows of one shape: split it")
    if shape == "draftkit":
        return [_parse_row(obj, source) for source, obj in objs]
    if shape == "humaneval":
        return [SuiteRow("code", _text(obj, "prompt", source), source, "HumanEval")
                for source, obj in objs]
    if shape == "gsm8k":
        return [SuiteRow("math", _text(obj, "question", source), source, "GSM8K")
                for source, obj in objs]
    return _questions(objs)


def _shape(source: str, obj) -> str:
    """Which suite shape a JSONL row is in (the module's docstring), or an error naming it."""
    if not isinstance(obj, dict) or "domain" in obj:
        return "draftkit"  # whose reader says what is wrong with it
    if "turns" in obj and "category" in obj:
        return "question"
    if "task_id" in obj and "entry_point" in obj:
        return "humaneval"
    if "question" in obj and "answer" in obj:
        return "gsm8k"
    if "prompt" in obj or "messages" in obj:
        return "draftkit"
    raise DraftkitError(f"{source}: a row of no suite shape draftkit reads (keys "
                        f"{', '.join(obj) or 'none'}); give {_SHAPES}")


def _text(obj: dict, key: str, source: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise DraftkitError(f"{source}: missing or empty '{key}'; give its text")
    return value


def _questions(objs: list) -> list[SuiteRow]:
    """MT-Bench's or Spec-Bench's questions: each one's first turn, its category the domain;
    Spec-Bench where a category is not one of MT-Bench's."""
    rows, categories = [], set()
    for source, obj in objs:
        category, asked = obj.get("category"), obj.get("turns")
        if not isinstance(category, str) or not category.strip():
            raise DraftkitError(f"{source}: missing or empty 'category'; give the question's "
                                f"category, e.g. \"writing\"")
        if not (isinstance(asked, list) and asked and
                all(isinstance(t, str) and t.strip() for t in asked)):
            raise DraftkitError(f"{source}: 'turns' must be a non-empty list of the question's "
                                f"turns as text")
        categories.add(category)
        rows.append((category, asked, source))
    name = "MT-Bench" if categories <= set(MT_BENCH_CATEGORIES) else "Spec-Bench"
    return [SuiteRow(category, asked[0], source, name, tuple(asked[1:]))
            for category, asked, source in rows]


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
