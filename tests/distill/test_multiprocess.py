"""Two processes over gloo on CPU, launched the way the recipes say (torchrun)."""

import dataclasses
import json
import os
import subprocess

import pytest
import yaml

from tests.helpers import distill_rows, rank_tails, torchrun

pytestmark = pytest.mark.slow  # each test launches two processes, twice


def _recipe(tmp_path, tiny_dirs, name, max_steps, every, grad_accum, stage=None,
            draft=None):
    """A tiny two-layer-draft recipe (``draft``: another draft section);
    ``stage``: recipes/deepspeed/zero<stage>.json."""
    train = {"batch_size": 1, "grad_accum": grad_accum, "checkpoint_every": max_steps,
             "device": "cpu"}
    if stage is not None:
        train["deepspeed"] = os.path.join(os.getcwd(), f"recipes/deepspeed/zero{stage}.json")
    recipe = tmp_path / "tiny_to_2l" / f"{name}.yaml"
    recipe.parent.mkdir()
    recipe.write_text(yaml.safe_dump({
        "out_dir": str(tmp_path / "run"), "max_steps": max_steps, "target": str(tiny_dirs[0]),
        "draft": draft or {"derive_layers": [0, 3]},
        "data": {"sources": [{"path": str(distill_rows(tmp_path))}], "seq_len": 48,
                 "heldout_per_domain": 2},
        "train": train, "eval": {"every": every}}))
    return recipe


def _launch(recipe, extra=(), timeout=240):
    """``torchrun --nproc_per_node 2 -m draftkit distill RECIPE`` over gloo; must succeed.
    ``timeout``: 240 s, for a DeepSpeed start on an empty cache builds its CPU comm op first
    (35 s of both cores here, alone); a plain launch takes about 8 s."""
    rc, out, err, seconds = torchrun(["-m", "draftkit", "distill", recipe, *extra], timeout)
    assert rc == 0, f"torchrun exited {rc} after {seconds:.0f} s\n{rank_tails(out, err)}"
    return subprocess.CompletedProcess([], rc, out, err)


def _steps(run):
    return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_torchrun_two_processes_gloo(tmp_path, tiny_dirs):
    _launch(_recipe(tmp_path, tiny_dirs, "fkl", max_steps=3, every=3, grad_accum=2),
            timeout=150)
    run = tmp_path / "run"
    assert _steps(run) == [0, 3]  # written once (rank 0), not once per process
    assert (run / "best" / "model.safetensors").is_file()
    assert (run / "checkpoints" / "step-0000003" / "manifest.json").is_file()
    # starting over: rank 0 sets the first run aside before any rank looks for checkpoints
    recipe = tmp_path / "tiny_to_2l" / "fkl.yaml"
    _launch(recipe, ["resume=false", "max_steps=2", "eval.every=2"], timeout=150)
    assert _steps(run) == [0, 2]
    (aside,) = run.glob("earlier-*")
    assert _steps(aside) == [0, 3]


def test_deepspeed_zero2_two_processes_and_resume(tmp_path, tiny_dirs):
    """ZeRO-2 through recipes/deepspeed/zero2.json over gloo, then a resume from its checkpoint."""
    recipe = _recipe(tmp_path, tiny_dirs, "fkl_zero2", max_steps=2, every=2, grad_accum=2,
                     stage=2)
    _launch(recipe)
    proc = _launch(recipe, ["max_steps=3"])
    assert "resuming from" in proc.stdout
    run = tmp_path / "run"
    assert _steps(run) == [0, 2, 3]
    shards = list((run / "checkpoints" / "step-0000003" / "state").glob("*optim_states.pt"))
    assert len(shards) == 2  # ZeRO partitioned the optimizer over the two ranks
    assert (run / "best" / "model.safetensors").is_file()


EAGLE3 = {"kind": "eagle3", "draft_vocab_size": 40, "ttt_steps": 2}


def test_an_eagle3_head_under_deepspeed_zero3(tmp_path, tiny_dirs):
    """ZeRO-3 partitions the unrolled head; best/ still holds it whole. (DDP over a head under
    torchrun runs in the guide's test, tests/engines/test_your_own_model.py.)"""
    from safetensors.torch import load_file

    recipe = _recipe(tmp_path, tiny_dirs, "eagle3_zero3", max_steps=2, every=1,
                     grad_accum=1, stage=3, draft=EAGLE3)
    _launch(recipe)
    run = tmp_path / "run"
    assert _steps(run) == [0, 1, 2]
    assert "tau" in json.loads((run / "best" / "best.json").read_text())
    # ZeRO-3 partitions every weight over the ranks; best/ still holds the whole head
    weights = load_file(run / "best" / "model.safetensors")
    assert weights["fc.weight"].shape == (32, 3 * 32)  # whole, not a shard
    assert weights["lm_head.weight"].shape == (40, 32)
    assert all(t.numel() > 0 for t in weights.values())
    assert (run / "checkpoints" / "step-0000002" / "manifest.json").is_file()


def test_zero3_rules_out_lora_and_on_policy_data(tmp_path):
    import pytest

    from draftkit.config import from_dict
    from draftkit.distill.config import DistillConfig
    from draftkit.distill.distributed import zero_stage
    from draftkit.errors import ConfigError

    def cfg(**over):
        data = {"target": "t", "draft": {"derive_layers": [0]},
                "data": {"sources": [{"path": "x.jsonl"}]},
                "train": {"deepspeed": os.path.join(os.getcwd(), "recipes/deepspeed/zero3.json")}}
        for key, value in over.items():
            data[key].update(value)
        return from_dict(DistillConfig, data, "test")

    assert zero_stage(cfg()) == 3
    with pytest.raises(ConfigError, match="LoRA with ZeRO-3"):
        zero_stage(cfg(draft={"lora": {"enabled": True}}))
    with pytest.raises(ConfigError, match="on-policy data"):
        zero_stage(cfg(data={"regime": "on_policy", "lmbda": 0.5}))


def test_a_run_ends_only_the_process_group_it_created(tmp_path, monkeypatch):
    """Left to interpreter exit, gloo's threads can abort a finished run; a group the caller
    made is the caller's to end."""
    import torch.distributed as td

    from draftkit.distill.distributed import close_distributed, init_distributed

    td.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                          world_size=1)
    try:
        monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun would say; the group exists already
        dist = init_distributed("cpu")
        assert not dist.owns_group
        close_distributed(dist)
        assert td.is_initialized()
        close_distributed(dataclasses.replace(dist, world_size=2, owns_group=True))
        assert not td.is_initialized()
    finally:
        if td.is_initialized():
            td.destroy_process_group()


STALL = """\
import os, sys, time
from pathlib import Path
from draftkit.distill.distributed import barrier, init_distributed
from draftkit.errors import DraftkitError

rank, stall = int(os.environ["RANK"]), sys.argv[1]
Path(sys.argv[2], f"rank{rank}.pid").write_text(str(os.getpid()))
try:
    if rank == 1 and stall == "join":
        time.sleep(600)  # alive, but never joins
    dist = init_distributed("cpu")
    if rank == 1:
        time.sleep(600)  # joined, then stuck: never reaches the barrier
    barrier(dist)
except DraftkitError as e:
    print(f"error: {e}", flush=True)  # as draftkit's command line says it
    sys.exit(2)
"""


@pytest.mark.parametrize("stall", ["join", "barrier"])
def test_a_stuck_rank_fails_the_launch_in_seconds(tmp_path, stall):
    """Rank 1 stays alive but never joins (or never reaches the barrier): rank 0 gives up after
    DRAFTKIT_DIST_TIMEOUT with one line naming what it waited at, torchrun stops rank 1 and no
    rank outlives the launch. Before, rank 0 waited gloo's 30 minutes and torchrun with it."""
    import psutil

    script = tmp_path / "stall.py"
    script.write_text(STALL)
    rc, out, err, seconds = torchrun([script, stall, tmp_path], timeout=120,
                                      env={"DRAFTKIT_DIST_TIMEOUT": "3"})
    said = f"after {seconds:.0f} s:\n{rank_tails(out, err)}"
    assert rc != 0, said
    assert seconds < 60, said  # rank 1 sleeps 600 s; this is 3 s, start-up and stopping
    what = "the start" if stall == "join" else "the barrier in stall.py"
    assert f"error: rank 0 of 2 waited 3 s for the other ranks at {what}" in out, said
    if stall == "barrier":  # torch's monitored barrier names the rank that never came
        assert "Ranks 1 failed to pass monitoredBarrier" in out, said
    for rank in (0, 1):
        pid = int((tmp_path / f"rank{rank}.pid").read_text())
        assert not psutil.pid_exists(pid), f"rank {rank} (pid {pid}) outlived the launch"


def test_a_bad_dist_timeout_is_one_line(monkeypatch):
    from draftkit.distill.distributed import dist_timeout
    from draftkit.errors import ConfigError

    monkeypatch.setenv("DRAFTKIT_DIST_TIMEOUT", "90")
    assert dist_timeout() == 90
    for bad in ("ten", "0", "-5"):
        monkeypatch.setenv("DRAFTKIT_DIST_TIMEOUT", bad)
        with pytest.raises(ConfigError, match="not a number of seconds above 0"):
            dist_timeout()
