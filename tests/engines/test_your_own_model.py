"""recipes/your-own-model.md with its engine steps, on a tiny Llama and a tiny Qwen3 folder with
a ShareGPT file: `draftkit init` for 8 GPUs, the dry run, ``--prepare`` with vLLM answering and
capturing the head's features, training under torchrun, `draftkit eval`, a signed export, `eval
--engine vllm` and `vllm serve my-bundle/draft`. Each command is read from the guide and run as
it is written there, with a tiny model's sizes after it (one vLLM replica, a short sequence, 2
steps, 2 ranks).

The quick layer runs the guide's steps without an engine (tests/distill/test_your_own_model.py);
the bundle's own `serving/vllm.sh` starts vLLM in tests/engines/test_vllm_front.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from draftkit.cli import main
from draftkit.manifest import read_manifest
from draftkit.signing import new_key_pair
from tests.helpers import (engine_llama, engine_qwen3, hf_greedy, make_tokenizer, save_model,
                           serve_draft_alone, torchrun)

pytestmark = pytest.mark.engine

GUIDE = Path(__file__).resolve().parents[2] / "recipes" / "your-own-model.md"
# a tiny model's sizes after the guide's commands
TINY = ["data.generate.replicas=1", "data.generate.max_new_tokens=8", "data.seq_len=64",
        "data.heldout_per_domain=2", "max_steps=2", "eval.every=2", "train.checkpoint_every=2"]
EVAL = ["--limit", "1", "--domains", "code", "chat", "--max-new-tokens", "8", "--k-sweep", "",
        "--batch-sizes", ""]


def guide_commands() -> list[str]:
    """The commands of the guide's bash blocks, continuations joined, comments dropped."""
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), re.S))
    lines = blocks.replace("\\\n", " ").splitlines()
    return [" ".join(x.split("#")[0].split()) for x in lines if x.split("#")[0].strip()]


def _sharegpt(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"conversations": [
        {"from": "human", "value": f"what is the sum of {i} and {i}"},
        {"from": "gpt", "value": f"the sum is {2 * i}"},
        {"from": "human", "value": "and twice that"},
        {"from": "gpt", "value": f"it is {4 * i}"}]}) + "\n" for i in range(n)))
    return path


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_the_guide_runs_through_vllm(family, vllm_worker, tmp_path, monkeypatch, capsys):
    tok = make_tokenizer()
    model = (engine_llama if family == "llama" else engine_qwen3)(len(tok), 8)
    target = str(save_model(model, tok, tmp_path / f"my-{family}"))
    _sharegpt(tmp_path / "chats.jsonl", 24)
    key, _ = new_key_pair(tmp_path / "keys")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path / "cache"))  # the guide's default folder
    head = f"runs/my-{family}_to_eagle3/best"
    commands, ran = guide_commands(), []

    def run(command: str, *sizes: str) -> None:
        """One of the guide's commands, its placeholders filled in, ``sizes`` after it."""
        assert command in commands, f"the guide no longer shows: {command}"
        ran.append(command)
        argv = command.replace("TARGET", target).replace("KEY.pem", str(key)).replace(
            "runs/NAME_to_eagle3/best", head).split() + list(sizes)
        if argv[0] == "torchrun":  # the guide's launch, with 2 ranks on this CPU
            code, out, err, _ = torchrun(argv[3:], timeout=240)
            assert code == 0, (out + err)[-3000:]
        else:
            assert argv[0] == "draftkit" and main(argv[1:]) == 0, command

    run("draftkit init --target TARGET --data chats.jsonl --gpus 8 --out my-head.yaml")
    recipe = yaml.safe_load(Path("my-head.yaml").read_text())
    assert recipe["data"]["generate"]["engine"] == "vllm"
    assert recipe["teacher"]["features"] == "vllm"
    run("draftkit distill my-head.yaml --dry-run")
    assert "data: 24 examples" in capsys.readouterr().out
    run("draftkit distill my-head.yaml --prepare", *TINY)
    run("torchrun --nproc_per_node 8 -m draftkit distill my-head.yaml", *TINY)
    # DDP over 2 ranks: metrics written once (rank 0), at the start and at step 2
    steps = [json.loads(x)["step"] for x in Path(head).parent.joinpath(
        "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 2] and "tau" in json.loads(Path(head, "best.json").read_text())
    run("draftkit eval --target TARGET --draft runs/NAME_to_eagle3/best --suite builtin "
        "--out runs/eval", *EVAL)
    run("draftkit export --target TARGET --draft runs/NAME_to_eagle3/best --report "
        "runs/eval/report.json --signing-key KEY.pem --out my-bundle")
    run("draftkit eval --target TARGET --draft my-bundle --engine vllm --out runs/eval-vllm",
        *EVAL)
    greedy = [r for r in json.loads(Path("runs/eval-vllm/report.json").read_text())["rows"]
              if r["temperature"] == 0]  # the trained head in vLLM, lossless and as draftkit
    assert greedy and all(r["spec_equals_plain"] == r["equals_draftkit"] == r["vllm"]["prompts"]
                          for r in greedy), greedy

    # `vllm serve my-bundle/draft`: the head folder names its target and K
    assert "vllm serve my-bundle/draft" in commands
    ran.append("vllm serve my-bundle/draft")
    prompts = [tok(p)["input_ids"] for p in ("what is the sum of 3 and 3", "and twice that")]
    got = serve_draft_alone(vllm_worker.python, tmp_path / "my-bundle" / "draft", prompts, 16)
    k = max(read_manifest(tmp_path / "my-bundle").num_speculative_tokens, 1)  # K 0 serves 1
    assert (got["target"], got["method"], got["k"]) == (target, "eagle3", k)
    assert got["tokens"] == [hf_greedy(model.float(), p, 16) for p in prompts]
    assert set(commands) - set(ran) == {"bash my-bundle/serving/vllm.sh"}
