"""The quickstart's time estimate: a probe of this machine, the reference run's stages scaled by
it, and the record of estimate and actual minutes."""

from __future__ import annotations

import json

import pytest

from draftkit.estimate import Probe, Timing, estimate, probe, read_timing, write_timing
from tests.helpers import distill_config


def _reference(**minutes) -> Timing:
    return Timing(probe=Probe(plain_step_ms=20.0, train_step_s=1.0, read_gb_per_s=40.0),
                  steps=180, decodes=2048, actual_minutes=minutes)


def test_each_stage_scales_with_what_it_is_made_of_and_the_work():
    ref = _reference(**{"set-up": 0.5, "data": 5.0, "distill": 6.0, "evaluate": 2.0,
                        "export": 0.2})
    here = Probe(plain_step_ms=50.0, train_step_s=3.0, read_gb_per_s=20.0)
    got = estimate(here, steps=90, decodes=4096, reference=ref)
    # target forwards x 2.5 (the plain step), training x 3 (its step) x 1/2 (the steps),
    # evaluation x 2.5 x 2 (the decoded tokens)
    assert got == pytest.approx({"set-up": 1.25, "data": 12.5, "distill": 9.0,
                                 "evaluate": 10.0, "export": 0.5})
    same = estimate(ref.probe, ref.steps, ref.decodes, ref)
    assert same == pytest.approx(ref.actual_minutes)


def test_timing_json_round_trips_and_a_missing_one_is_none(tmp_path):
    assert read_timing(tmp_path) is None
    timing = _reference(data=1.5, distill=2.0)
    timing.estimate_minutes = {"data": 1.0, "distill": 2.5}
    write_timing(tmp_path, timing)
    back = read_timing(tmp_path)
    assert back == timing and back.total_actual == 3.5 and back.total_estimate == 3.5
    assert json.loads((tmp_path / "timing.json").read_text())["probe"]["plain_step_ms"] == 20.0


def test_the_probe_times_the_target_and_a_head_of_the_recipes_shape(tiny_dirs):
    from draftkit.models import load_model
    from draftkit.models.eagle3 import from_target
    from draftkit.models.reduced_head import ReducedHead

    target = load_model(str(tiny_dirs[0]), device="cpu", dtype="float32")
    head = from_target(target, ReducedHead(range(40), target.config.vocab_size), [1, 2, 3])
    before = [p.detach().clone() for p in head.parameters()]
    got = probe(target, head, batch_size=2, seq_len=16, ttt_steps=2)
    assert got.plain_step_ms > 0 and got.train_step_s > 0 and got.read_gb_per_s > 0
    # the head was trained (its step is what is timed), not just run forward
    assert any(not p.equal(q) for p, q in zip(head.parameters(), before))


def test_the_quickstart_prints_an_estimate_scaled_from_its_reference(tmp_path, tiny_dirs,
                                                                     monkeypatch, capsys):
    import draftkit.quickstart as qs

    cfg = distill_config(tmp_path, tiny_dirs, draft={"kind": "eagle3", "draft_vocab_size": 40})
    args = qs.QuickstartArgs(eval_limit=2, eval_tokens=8)
    monkeypatch.setattr(qs, "reference_dir", lambda: tmp_path / "nowhere")
    import time

    timing = qs._estimate(cfg, args, domains=4, started=time.perf_counter() - 6)
    assert "no reference run" in capsys.readouterr().out and not timing.estimate_minutes
    ref = tmp_path / "ref"
    write_timing(ref, _reference(**{"set-up": 0.5, "data": 5.0, "distill": 6.0,
                                   "evaluate": 2.0, "export": 0.2}))
    monkeypatch.setattr(qs, "reference_dir", lambda: ref)
    timing = qs._estimate(cfg, args, domains=4, started=time.perf_counter() - 6)
    said = capsys.readouterr().out
    assert timing.steps == cfg.max_steps and timing.decodes == 4 * 2 * 8
    assert timing.estimate_minutes["set-up"] >= 0.1  # the 6 s before it and the probe
    assert set(timing.estimate_minutes) == {"set-up", "data", "distill", "evaluate", "export"}
    assert "this machine: a plain step" in said and "total     about" in said
    assert timing.reference_probe == _reference().probe
    assert "the machine the README's figures came from" in qs.machine_text(timing)
