"""Shared fixtures of the evaluation tests."""

import json

import pytest


@pytest.fixture
def suite(tmp_path):
    rows = [{"domain": "code", "prompt": "write python code for the sum"},
            {"domain": "code", "prompt": "def x return y"},
            {"domain": "chat", "prompt": "what is the answer"},
            {"domain": "chat", "messages": [{"role": "user", "content": "hello world"}]}]
    path = tmp_path / "suite.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path
