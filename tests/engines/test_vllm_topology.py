"""The topology of a large EAGLE-3 run (recipes/eagle3-at-scale.md), in miniature on a CPU: two
vLLM engine processes answer the training prompts (data-parallel replicas), a vLLM engine
captures the target's features into the cache, and a two-process trainer (torchrun over gloo)
trains the head from them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.helpers import engine_llama, make_tokenizer, save_model

pytestmark = pytest.mark.engine


def test_two_engine_workers_feed_a_two_process_trainer(vllm_worker, tmp_path):
    tok = make_tokenizer()
    target = save_model(engine_llama(len(tok), 6, seed=2), tok, tmp_path / "target")
    prompts = tmp_path / "prompts.jsonl"
    words = "the a of to and in is it that for on with as was he she they we you".split()
    prompts.write_text("".join(json.dumps({"prompt": " ".join(words[i:i + 4]),
                                           "domain": "code" if i % 2 else "math"}) + "\n"
                               for i in range(16)))
    recipe = tmp_path / "tiny_to_eagle3" / "engines.yaml"
    recipe.parent.mkdir()
    recipe.write_text(yaml.safe_dump({
        "out_dir": str(tmp_path / "run"), "max_steps": 2, "seed": 0, "target": str(target),
        "draft": {"kind": "eagle3", "draft_vocab_size": 40, "ttt_steps": 2},
        "data": {"sources": [{"path": str(prompts)}], "regime": "target", "seq_len": 48,
                 "heldout_per_domain": 2,
                 "generate": {"max_new_tokens": 12, "batch_size": 4, "engine": "vllm",
                              "replicas": 2, "cache_dir": str(tmp_path / "answers")}},
        "teacher": {"mode": "cache", "top_k": 8, "features": "vllm",
                    "cache_dir": str(tmp_path / "caches")},
        "train": {"batch_size": 2, "grad_accum": 1, "checkpoint_every": 2, "device": "cpu"},
        "eval": {"every": 2, "batch_size": 4}}))
    env = dict(os.environ, WANDB_MODE="disabled", OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                           "2", "--master_port", "29541", "-m", "draftkit", "distill",
                           str(recipe)], env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 2]  # rank 0 writes, once
    assert (run / "best" / "model.safetensors").is_file()
    (answers,) = (tmp_path / "answers").glob("responses-*.jsonl")  # one cache, the engine's
    assert len(answers.read_text().splitlines()) == 16
    metas = [json.loads(p.read_text()) for p in (tmp_path / "caches").rglob("meta.json")]
    features = [m for m in metas if "layers" in m]
    assert features and features[0]["filled_rows"] == features[0]["rows"] > 0
