"""The templated prompt files are what their script writes, and share no prompt with eval."""

import json
from pathlib import Path

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]


def _prompts(path):
    return [json.loads(line).get("prompt") for line in path.read_text().splitlines() if line]


def test_templated_prompts_are_reproducible_and_unseen():
    script = load_script(ROOT / "recipes" / "data" / "make_prompts.py")
    files = {d: ROOT / "recipes" / "data" / f"{d}_prompts_templated.jsonl"
             for d in ("code", "math")}
    committed = {d: _prompts(p) for d, p in files.items()}
    again = script.templated(len(committed["code"]), len(committed["math"]), seed=0)
    assert again == committed
    evaluated = {p for f in (ROOT / "eval").glob("*/*.jsonl") for p in _prompts(f)} - {None}
    for prompts in committed.values():
        assert len(set(prompts)) == len(prompts)
        assert not evaluated & set(prompts)
