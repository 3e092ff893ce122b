"""The real target: a cut draft distilled for a few steps on chat rows gains held-out alpha."""

import json

import pytest


@pytest.mark.embedded
def test_embedded_few_steps_raise_alpha(tmp_path, embedded_dir):
    from draftkit.config import from_dict
    from draftkit.distill.config import DistillConfig
    from draftkit.distill.trainer import train

    rows = [{"prompt": f"What is {a} plus {a + 1}?", "domain": "math",
             "response": f"{a} plus {a + 1} is {2 * a + 1}."} for a in range(2, 14)]
    data = tmp_path / "math.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = from_dict(DistillConfig, {
        "out_dir": str(tmp_path / "run"), "max_steps": 6, "target": str(embedded_dir),
        "draft": {"derive_layers": [0, 29], "freeze": ["embeddings"]},
        "data": {"sources": [{"path": str(data)}], "seq_len": 64, "heldout_per_domain": 3},
        "loss": {"divergence": "tvd"},
        "teacher": {"mode": "cache", "top_k": 16, "cache_dir": str(tmp_path / "cache")},
        "train": {"batch_size": 4, "lr": 1e-3, "warmup_steps": 1, "checkpoint_every": 6,
                  "device": "cpu"},
        "eval": {"every": 6}}, "test")
    train(cfg, progress=False)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["alpha/math"] > lines[0]["alpha/math"]
