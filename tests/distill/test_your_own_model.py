"""recipes/your-own-model.md, run on a tiny Llama and a tiny Qwen3 folder with a ShareGPT file:
init and the dry run as the guide writes them (for 8 GPUs), then the same recipe for this CPU
trained a few steps, exported, checked. Every command of the guide, its engine steps too
(--prepare in vLLM, torchrun, eval --engine vllm, `vllm serve BUNDLE/draft`), runs in the engine
layer: tests/engines/test_your_own_model.py."""

import json
import re
from pathlib import Path

import pytest

from draftkit.cli import main
from tests.helpers import make_llama, make_qwen3, make_tokenizer, save_model

GUIDE = Path(__file__).resolve().parents[2] / "recipes" / "your-own-model.md"


def _sharegpt(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"conversations": [
        {"from": "system", "value": "be brief"},
        {"from": "human", "value": f"what is the sum of {i} and {i}"},
        {"from": "gpt", "value": f"the sum is {2 * i}"},
        {"from": "human", "value": "and twice that"},
        {"from": "gpt", "value": f"it is {4 * i}"}]}) + "\n" for i in range(n)))
    return path


def test_the_guide_shows_the_commands_tested_here():
    text = GUIDE.read_text()
    for command in ("draftkit init --target TARGET --data chats.jsonl --gpus 8 --out my-head.yaml",
                    "draftkit distill my-head.yaml --dry-run",
                    "draftkit distill my-head.yaml --prepare",
                    "torchrun --nproc_per_node 8 -m draftkit distill my-head.yaml",
                    "vllm serve my-bundle/draft"):
        assert command in text, command
    assert re.search(r"draftkit eval .* --engine vllm", text)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_head_for_your_own_model(family, tmp_path, monkeypatch, capsys):
    tok = make_tokenizer()
    model = make_llama(len(tok), num_layers=4) if family == "llama" else \
        make_qwen3(len(tok), 4)
    target = save_model(model, tok, tmp_path / f"my-{family}")
    data = _sharegpt(tmp_path / "chats.jsonl", 24)
    monkeypatch.chdir(tmp_path)
    assert main(["init", "--target", str(target), "--data", str(data), "--gpus", "8",
                 "--out", "my-head.yaml"]) == 0
    assert main(["distill", "my-head.yaml", "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert "data: 24 examples" in said and "passes over the data" in said
    # the same data on this CPU, a few steps
    assert main(["init", "--target", str(target), "--data", str(data), "--gpus", "0",
                 "--out", "cpu.yaml"]) == 0
    assert main(["distill", "cpu.yaml", "max_steps=2", "data.seq_len=64",
                 "data.generate.max_new_tokens=8", "data.heldout_per_domain=2",
                 "eval.every=2", "train.checkpoint_every=2", "out_dir=run"]) == 0
    assert main(["export", "--target", str(target), "--draft", "run/best", "--out",
                 "my-bundle", "--k", "3"]) == 0
    assert main(["check", "my-bundle", "--target", str(target)]) == 0
    card = (tmp_path / "my-bundle" / "draft" / "README.md").read_text()
    assert "EAGLE-3 head" in card and "chats.jsonl (chat)" in card
    config = json.loads((tmp_path / "my-bundle" / "draft" / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == str(target)
