"""The shipped evaluation suites and training prompts, and the suite loader's errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from draftkit.chat import as_messages
from draftkit.errors import DraftkitError
from draftkit.evaluate import (SuiteRow, builtin_suites_dir, builtin_train_prompts_dir,
                               by_domain, load_suite)

DOMAINS = {"code", "math", "chat", "summarization", "translation", "creative"}


def _key(row: SuiteRow) -> str:
    """A prompt's last user turn, lowercased with punctuation and spacing collapsed."""
    return re.sub(r"\W+", " ", as_messages(row.prompt)[-1]["content"].lower()).strip()


def _write(path: Path, *lines) -> Path:
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n"
                            for ln in lines))
    return path


# --- the shipped prompts -------------------------------------------------------------------

@pytest.mark.parametrize("folder, minimum", [(builtin_suites_dir, 40),
                                             (builtin_train_prompts_dir, 60)])
def test_shipped_prompts_cover_every_domain(folder, minimum):
    groups = by_domain(load_suite(folder()))
    assert set(groups) == DOMAINS
    for domain, rows in groups.items():
        assert len(rows) >= minimum, domain
        # One file per domain, named after it, holding only that domain.
        assert {Path(r.source.rpartition(":")[0]).name for r in rows} == {f"{domain}.jsonl"}
        for r in rows:
            as_messages(r.prompt)  # the form every stage renders


@pytest.mark.parametrize("folder", [builtin_suites_dir, builtin_train_prompts_dir])
def test_shipped_prompts_have_no_duplicates(folder):
    seen: dict[str, str] = {}
    for row in load_suite(folder()):
        assert _key(row) not in seen, f"{row.source} repeats {seen[_key(row)]}"
        seen[_key(row)] = row.source


@pytest.mark.parametrize("training", [builtin_train_prompts_dir,
                                      lambda: builtin_suites_dir().parent.parent / "recipes" /
                                      "data"])
def test_training_prompts_share_no_prompt_with_the_suites(training):
    suites = {_key(r): r.source for r in load_suite(builtin_suites_dir())}
    shared = [f"{r.source} = {suites[_key(r)]}" for r in load_suite(training())
              if _key(r) in suites]
    assert not shared, shared


def test_summarization_prompts_hold_a_paragraph():
    for row in load_suite(builtin_suites_dir(), domains=["summarization"]):
        assert row.prompt.startswith("Summarize")
        assert 60 <= len(row.prompt.split(":", 1)[1].split()) <= 150, row.source


def test_builtin_dir_is_eval_suites_in_the_repository():
    """The packaged suites (draftkit/share/eval/suites) are the checkout's eval/suites, the
    same files, not a second set."""
    root = Path(__file__).resolve().parents[2]
    assert builtin_suites_dir().resolve() == root / "eval" / "suites"
    assert builtin_train_prompts_dir().resolve() == root / "eval" / "train_prompts"


def test_missing_builtin_dir_says_where_it_looked(monkeypatch, tmp_path):
    from draftkit import resources

    monkeypatch.setattr(resources, "share_path", lambda *parts: tmp_path.joinpath(*parts))
    with pytest.raises(DraftkitError, match=r"eval/suites is missing from this install "
                                            r".*; reinstall draftkit"):
        builtin_suites_dir()


# --- loading -------------------------------------------------------------------------------

@pytest.fixture
def suite_dir(tmp_path):
    d = tmp_path / "suite"
    d.mkdir()
    _write(d / "b.jsonl", {"domain": "math", "prompt": "m1"}, {"domain": "code", "prompt": "c1"},
           "", {"domain": "math", "prompt": "m2"})
    _write(d / "a.jsonl", {"domain": "code", "prompt": "c0"},
           {"domain": "chat", "messages": [{"role": "system", "content": "be brief"},
                                           {"role": "user", "content": "hi"}]})
    (d / "notes.txt").write_text("not a suite\n")
    return d


def test_folder_reads_sorted_jsonl_files_in_order(suite_dir):
    rows = load_suite(suite_dir)
    assert [r.prompt if isinstance(r.prompt, str) else "chat" for r in rows] == \
        ["c0", "chat", "m1", "c1", "m2"]
    assert rows[0] == SuiteRow("code", "c0", f"{suite_dir / 'a.jsonl'}:1")
    assert rows[-1].source == f"{suite_dir / 'b.jsonl'}:4"  # blank line 3 is skipped
    assert rows[1].prompt[-1] == {"role": "user", "content": "hi"}


def test_file_and_folder_give_the_same_rows(suite_dir):
    one = load_suite(str(suite_dir / "b.jsonl"))
    assert one == [r for r in load_suite(suite_dir) if r.source.startswith(str(suite_dir / "b"))]


def test_limit_keeps_the_first_rows_of_each_domain(suite_dir):
    rows = load_suite(suite_dir, limit=1)
    assert [r.source.rpartition("/")[2] for r in rows] == ["a.jsonl:1", "a.jsonl:2", "b.jsonl:1"]
    assert len(load_suite(builtin_suites_dir(), limit=5)) == 5 * len(DOMAINS)


def test_domain_filter(suite_dir):
    rows = load_suite(suite_dir, domains=["math", "chat"])
    assert [r.domain for r in rows] == ["chat", "math", "math"]
    assert [r.prompt for r in load_suite(suite_dir, limit=1, domains=["math"])] == ["m1"]


def test_by_domain_keeps_first_seen_order(suite_dir):
    groups = by_domain(load_suite(suite_dir))
    assert list(groups) == ["code", "chat", "math"]
    assert [r.prompt for r in groups["code"]] == ["c0", "c1"]


def test_rows_are_frozen():
    row = SuiteRow("code", "x", "f:1")
    with pytest.raises(AttributeError):
        row.domain = "math"


# --- errors --------------------------------------------------------------------------------

GOOD = {"domain": "code", "prompt": "ok"}
BAD_ROWS = {
    "invalid_json": ('{"domain": "code", "prompt": ', r"invalid JSON"),
    "not_an_object": ('["code", "a prompt"]', r"JSON object.*got list"),
    "missing_domain": ({"prompt": "p"}, r"missing or empty 'domain'"),
    "empty_domain": ({"domain": "  ", "prompt": "p"}, r"missing or empty 'domain'"),
    "domain_not_text": ({"domain": 3, "prompt": "p"}, r"missing or empty 'domain'"),
    "no_prompt_or_messages": ({"domain": "code"}, r"exactly one of 'prompt'.*'messages'"),
    "both_prompt_and_messages": ({"domain": "code", "prompt": "p",
                                  "messages": [{"role": "user", "content": "p"}]},
                                 r"exactly one of 'prompt'.*'messages'"),
    "empty_prompt": ({"domain": "code", "prompt": " \t"}, r"empty 'prompt'"),
    "prompt_not_text": ({"domain": "code", "prompt": 5}, r"empty 'prompt'"),
    "messages_not_list": ({"domain": "chat", "messages": "hi"}, r"non-empty list"),
    "messages_empty": ({"domain": "chat", "messages": []}, r"non-empty list"),
    "message_not_object": ({"domain": "chat", "messages": ["hi"]}, r"messages\[0\]"),
    "message_bad_role": ({"domain": "chat", "messages": [{"role": "bot", "content": "hi"}]},
                         r"messages\[0\] has role 'bot'"),
    "message_no_content": ({"domain": "chat", "messages": [{"role": "user"}]},
                           r"messages\[0\] has missing or empty 'content'"),
    "message_unknown_key": ({"domain": "chat", "messages": [{"role": "user", "content": "hi",
                                                             "name": "ann"}]},
                            r"messages\[0\] has unknown key 'name'"),
    "messages_end_with_assistant": ({"domain": "chat", "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
        r"last message must have role 'user'"),
    "unknown_key": ({"domain": "code", "prompt": "p", "answer": "42"}, r"unknown key 'answer'"),
}


@pytest.mark.parametrize("case", BAD_ROWS)
def test_bad_row_names_file_and_line(tmp_path, case):
    line, pattern = BAD_ROWS[case]
    path = _write(tmp_path / "bad.jsonl", GOOD, "", line)  # the bad row is on line 3
    with pytest.raises(DraftkitError, match=re.escape(f"{path}:3: ") + ".*" + pattern) as e:
        load_suite(tmp_path)
    assert "\n" not in str(e.value)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n  \n")
    with pytest.raises(DraftkitError, match=re.escape(f"{path}: ") + "the suite file has no "):
        load_suite(path)


def test_empty_folder(tmp_path):
    (tmp_path / "readme.txt").write_text("no suites here")
    with pytest.raises(DraftkitError, match=re.escape(f"{tmp_path}: ") + r".*no \*\.jsonl files"):
        load_suite(tmp_path)


def test_nonexistent_path(tmp_path):
    with pytest.raises(DraftkitError, match=r"nope\.jsonl: no such suite file or folder"):
        load_suite(tmp_path / "nope.jsonl")


def test_unknown_domain_lists_the_present_ones(suite_dir):
    with pytest.raises(DraftkitError, match=r"domain\(s\) poetry; the suite has code, chat, math"):
        load_suite(suite_dir, domains=["code", "poetry"])


def test_limit_must_be_positive(suite_dir):
    with pytest.raises(DraftkitError, match="positive"):
        load_suite(suite_dir, limit=0)


def test_a_suite_that_is_not_utf8_is_one_error_naming_file_and_line(tmp_path):
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes('{"domain": "code", "prompt": "ok"}\n'
                    '{"domain": "code", "prompt": "café"}\n'.encode("latin-1"))
    with pytest.raises(DraftkitError) as e:  # not a UnicodeDecodeError traceback
        load_suite(bad)
    assert str(e.value).startswith(f"{bad}:2: not UTF-8") and "\n" not in str(e.value)


def test_a_utf8_bom_is_not_part_of_the_first_row(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + '{"domain": "code", "prompt": "café"}\r\n'.encode())
    assert [(r.domain, r.prompt, r.source) for r in load_suite(path)] == \
        [("code", "café", f"{path}:1")]
