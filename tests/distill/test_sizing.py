"""`draftkit distill --dry-run` sizes the job: examples, tokens, packed rows, passes over the
data, cache bytes and their folder, and a warning where the steps repeat the data."""

import json

from draftkit.cli import main
from draftkit.distill.command import load_config
from draftkit.distill.sizing import size_job, size_lines, target_facts


def _recipe(tmp_path, target, rows: int, steps: int, target_spec: str | None = None):
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"what is {i} plus {i}?"},
        {"role": "assistant", "content": f"it is {2 * i}, since {i} and {i} make {2 * i}"}]})
        + "\n" for i in range(rows)))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"""
target: {target_spec or target}
max_steps: {steps}
draft: {{kind: eagle3, draft_vocab_size: 40}}
data: {{sources: [{{path: {data}, domain: chat}}], regime: fixed, seq_len: 64}}
teacher: {{mode: cache, top_k: 8, cache_dir: {tmp_path / "cache"}}}
train: {{batch_size: 2, grad_accum: 2}}
""")
    return recipe


def test_the_dry_run_sizes_the_job_from_the_data_and_the_target(tiny_dirs, tmp_path, capsys):
    target, _ = tiny_dirs
    recipe = _recipe(tmp_path, target, rows=40, steps=50)
    cfg = load_config(recipe)
    tokenizer, hidden = target_facts(str(target))
    size = size_job(cfg, tokenizer, hidden)
    assert size.examples == 40 and not size.estimated and size.rows_per_step == 4
    assert 0 < size.trained_tokens < size.tokens
    assert size.packed_rows == -(-size.tokens // 64)
    assert size.passes == 50 * 4 / size.packed_rows
    assert size.teacher_bytes == size.trained_tokens * 8 * 6
    assert size.feature_bytes == size.tokens * 3 * hidden * 2
    assert size.cache == tmp_path / "cache"
    lines = size_lines(size)
    assert any(line.startswith("warning: max_steps goes over the data") for line in lines) == \
        (size.passes > 5)
    assert main(["distill", str(recipe), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "data: 40 examples" in out and f"in {tmp_path / 'cache'}" in out


def test_a_hub_target_not_on_this_machine_is_sized_by_estimate(tiny_dirs, tmp_path, capsys):
    target, _ = tiny_dirs
    recipe = _recipe(tmp_path, target, rows=10, steps=500, target_spec="org/not-cached")
    assert target_facts("org/not-cached") == (None, None)
    assert main(["distill", str(recipe), "--dry-run"]) == 0  # offline, no download
    out = capsys.readouterr().out
    assert "tokens estimated at 4 characters each" in out
    assert "feature cache (not sized" in out and "warning: max_steps goes over" in out


def test_the_8b_recipe_is_sized_without_network(capsys, monkeypatch):
    """The 8B recipe's target is a hub id no test machine holds: offline, the dry run still
    prints rows, passes and both caches, the features at the hidden size its config
    publishes (4096: three bf16 states, 24 KiB a token)."""
    from pathlib import Path

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    recipe = Path(__file__).parents[2] / "recipes" / "llama3.1-8b-instruct_to_eagle3" / \
        "ttt7_fkl.yaml"
    cfg = load_config(recipe)
    tokenizer, hidden = target_facts(cfg.target)
    assert hidden == 4096  # from the local cache where a machine holds it, else published
    size = size_job(cfg, tokenizer, hidden)
    assert size.feature_bytes == size.tokens * 3 * 4096 * 2
    assert main(["distill", str(recipe), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "packed rows" in out and "passes over the data" in out
    assert "the feature cache" in out and "not sized" not in out
    assert ("at the hidden size the target's published" in out) == (tokenizer is None)
