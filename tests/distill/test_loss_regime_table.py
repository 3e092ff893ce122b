"""eval/benchmarks/loss_regime_table.py end to end on tiny random models (2 losses x 3 regimes)."""

import importlib.util
import json
import random
from pathlib import Path

import yaml

from tests.distill.test_trainer import WORDS

SCRIPT = Path(__file__).resolve().parents[2] / "eval" / "benchmarks" / "loss_regime_table.py"


def test_every_cell_is_trained_and_scored_on_one_heldout_set(tmp_path, tiny_dirs):
    spec = importlib.util.spec_from_file_location("loss_regime_table", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rng = random.Random(0)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join(rng.sample(WORDS, 4)),
                                           "domain": "code"}) + "\n" for _ in range(10)))
    text = tmp_path / "text.jsonl"
    text.write_text("".join(json.dumps({"text": " ".join(rng.choices(WORDS, k=30)),
                                        "domain": "code"}) + "\n" for _ in range(10)))
    recipe = tmp_path / "tiny_to_2l" / "base.yaml"
    recipe.parent.mkdir()
    recipe.write_text(yaml.safe_dump({
        "target": str(tiny_dirs[0]), "draft": {"derive_layers": [0, 3]},
        "data": {"sources": [{"path": str(prompts)}], "seq_len": 48, "heldout_per_domain": 2,
                 "generate": {"max_new_tokens": 8, "cache_dir": str(tmp_path / "gen")}},
        "teacher": {"mode": "online"},
        "train": {"batch_size": 2, "device": "cpu"}, "eval": {"batch_size": 4}}))
    out = tmp_path / "table"
    assert mod.main(["--recipe", str(recipe), "--prompts", str(prompts), "--fixed-text",
                     str(text), "--steps", "2", "--losses", "fkl", "tvd", "--out",
                     str(out)]) == 0
    table = json.loads((out / "table.json").read_text())
    assert set(table["cells"]) == {f"{loss}-{r}" for loss in ("fkl", "tvd")
                                   for r in ("fixed", "target", "on_policy")}
    assert all(0.0 <= c["alpha"] <= 1.0 for c in table["cells"].values())
    assert (out / "table.png").is_file() and "| fkl |" in (out / "table.md").read_text()
    assert (out / "tvd-on_policy" / "best" / "model.safetensors").is_file()
