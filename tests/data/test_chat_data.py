"""Chat data as it comes: the published row shapes."""

import json
import re

import pytest

from draftkit.data import load_examples
from draftkit.distill.config import DataSource
from draftkit.errors import DraftkitError


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


USER_WORDS = ("water", "oil", "people", "time", "day", "number", "way", "part")


def _sharegpt(i: int) -> dict:
    """A two-turn ShareGPT conversation; the user and gpt speak words of sets of their own."""
    return {"id": f"c{i}", "conversations": [
        {"from": "system", "value": "you are here"},
        {"from": "human", "value": f"what is {USER_WORDS[i]} ?"},
        {"from": "gpt", "value": f"answer {i} ."},
        {"from": "human", "value": "why"},
        {"from": "gpt", "value": "it was so ."}]}


# --- the row shapes -----------------------------------------------------------------------------

def test_each_published_shape_is_read_by_its_columns(tmp_path):
    turns = [("user", "hi"), ("assistant", "hello"), ("user", "why"), ("assistant", "so")]
    files = {
        "sharegpt": [{"id": "1", "system": "be brief", "conversations": [
            {"from": {"user": "human", "assistant": "gpt"}[r], "value": c} for r, c in turns]}],
        "specforge": [{"id": "1", "conversations": [
            {"role": "system", "content": "be brief"}] + [
            {"role": r, "content": c} for r, c in turns]}],
        "messages": [{"messages": [{"role": "system", "content": "be brief"}] + [
            {"role": r, "content": c} for r, c in turns]}],
    }
    for shape, rows in files.items():
        path = _jsonl(tmp_path / f"{shape}.jsonl", rows)
        for named in ("auto", shape):
            (ex,) = load_examples([DataSource(path=str(path), domain="chat",
                                              shape=named)])["chat"]
            assert ex.messages == [{"role": "system", "content": "be brief"},
                                   {"role": "user", "content": "hi"},
                                   {"role": "assistant", "content": "hello"},
                                   {"role": "user", "content": "why"}], shape
            assert ex.response == "so"
    # SpecForge's regenerated answers keep their reasoning for the template
    path = _jsonl(tmp_path / "reasoning.jsonl", [{"conversations": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "reasoning_content": "greet"}]}])
    (ex,) = load_examples([DataSource(path=str(path), domain="chat")])["chat"]
    assert (ex.response, ex.reasoning) == ("hello", "greet")
    others = _jsonl(tmp_path / "others.jsonl", [
        {"prompt": "what is 2 ?", "response": 2}, {"prompt_ids": [5, 6], "response_ids": [7]},
        {"text": "def f ( ) : return 1"}])
    a, b, c = load_examples([DataSource(path=str(others), domain="x")])["x"]
    assert a.messages == [{"role": "user", "content": "what is 2 ?"}] and a.response == "2"
    assert (b.prompt_ids, b.response_ids, c.text) == ([5, 6], [7], "def f ( ) : return 1")


def test_a_row_of_no_shape_or_not_the_named_one_stops_the_run_naming_it(tmp_path):
    good = _sharegpt(1)
    path = _jsonl(tmp_path / "chats.jsonl", [good, {"question": "2 + 2 ?", "answer": "4"}])
    with pytest.raises(DraftkitError, match=re.escape(
            "chats.jsonl:2: the row is in none of the shapes draftkit reads (its columns: "
            "question, answer); expected ShareGPT (conversations of from/value "
            "turns), SpecForge (conversations of role/content turns), OpenAI messages")):
        load_examples([DataSource(path=str(path), domain="chat")])
    _jsonl(path, [good, {"messages": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(DraftkitError, match=re.escape(
            "chats.jsonl:2: the source's shape is sharegpt and this row is messages")):
        load_examples([DataSource(path=str(path), domain="chat", shape="sharegpt")])
    for turns, said in (
            ([{"from": "human", "value": "hi"}, {"from": "tool", "value": "x"}],
             "turn 2 is from 'tool'; a ShareGPT turn needs 'from' (one of human, user, gpt"),
            ([{"from": "gpt", "value": "hello"}, {"from": "human", "value": "hi"}],
             "the chat opens with an assistant turn"),
            ([{"from": "gpt", "value": "hello"}], "the chat has no user turn")):
        _jsonl(path, [{"conversations": turns}])
        with pytest.raises(DraftkitError, match=re.escape(f"chats.jsonl:1: {said}")):
            load_examples([DataSource(path=str(path), domain="chat")])
