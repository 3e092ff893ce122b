"""`draftkit init`: a recipe for the user's target and data that `distill --dry-run` takes,
each choice said, the steps from the data's size."""

import json

import yaml

from draftkit.cli import main


def test_init_writes_a_recipe_the_dry_run_takes(tiny_dirs, tmp_path, capsys, monkeypatch):
    target, _ = tiny_dirs
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "answer"}
    ]}) + "\n" for i in range(100)))
    monkeypatch.chdir(tmp_path)
    assert main(["init", "--target", str(target), "--data", str(data), "--gpus", "2",
                 "--epochs", "3", "--out", "mine.yaml"]) == 0
    recipe = yaml.safe_load((tmp_path / "mine.yaml").read_text())
    text = (tmp_path / "mine.yaml").read_text()
    assert recipe["max_steps"] == 20  # 100 rows x 3 epochs / (2 GPUs x 2 x 4) = 19 -> 20
    assert "100 rows x 3 epochs / 16 rows a step" in text
    assert recipe["draft"]["kind"] == "eagle3" and recipe["data"]["regime"] == "target"
    assert recipe["data"]["generate"]["replicas"] == 2
    assert "torchrun --nproc_per_node 2 -m draftkit distill RECIPE" in text
    capsys.readouterr()
    assert main(["distill", "mine.yaml", "--dry-run"]) == 0
    assert "is valid" in capsys.readouterr().out
    assert main(["init", "--target", str(target), "--data", str(data), "--out",
                 "mine.yaml"]) == 2  # never replaced without --force
    assert "mine.yaml exists; pass --force" in capsys.readouterr().err
    assert main(["init", "--target", "org/not-in-the-cache", "--data", str(data)]) == 2
    assert "its config.json is not in the Hugging Face cache" in capsys.readouterr().err
