"""The loop end to end on tiny random models: outputs, exact resume, NaN stop, cache, LoRA."""

import json
import random
from pathlib import Path

import pytest
import torch

from draftkit.errors import DraftkitError
from tests.helpers import ROW_WORDS, distill_config, distill_loaded, tiny_recipe

def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _state(run):
    from draftkit.distill.checkpoint import list_checkpoints, load_checkpoint

    return load_checkpoint(list_checkpoints(run / "checkpoints")[-1])["model"]


def test_train_writes_run_folder(tmp_path, tiny_dirs):
    from draftkit.distill.trainer import train

    best = train(distill_config(tmp_path, tiny_dirs), progress=False)
    run = tmp_path / "run"
    assert (best / "config.json").is_file() and (best / "model.safetensors").is_file()
    assert (best / "tokenizer.json").is_file()
    assert (run / "config.yaml").is_file()
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 2, 4]
    assert {"alpha/math", "alpha/code", "loss", "alpha", "minutes"} <= set(lines[-1])
    assert all(0.0 <= x["alpha/math"] <= 1.0 for x in lines)
    assert 0 < lines[0]["minutes"] <= lines[-1]["minutes"]  # for alpha-against-minutes curves
    best_row = json.loads((run / "best" / "best.json").read_text())
    assert best_row["alpha"] == max(x["alpha"] for x in lines)  # chosen by alpha


def test_resume_is_exact(tmp_path, tiny_dirs):
    from draftkit.distill.trainer import train

    train(distill_config(tmp_path, tiny_dirs, "straight"), progress=False)
    cfg = distill_config(tmp_path, tiny_dirs, "resumed")
    train(cfg, stop_after=2, progress=False)  # killed right after the step-2 checkpoint
    train(cfg, progress=False)
    a, b = _state(tmp_path / "straight"), _state(tmp_path / "resumed")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    steps = [json.loads(x)["step"] for x in (tmp_path / "resumed" / "metrics.jsonl")
             .read_text().splitlines()]
    assert steps == [0, 2, 4]


def test_resume_false_starts_over_and_keeps_the_earlier_run(tmp_path, tiny_dirs):
    from draftkit.distill.trainer import train

    run = tmp_path / "run"
    train(distill_config(tmp_path, tiny_dirs, max_steps=6), progress=False)
    old_metrics = (run / "metrics.jsonl").read_text()
    # killed inside a best/ write: recovered into the earlier run before it is set aside
    (run / "best").rename(run / ".best.old-4242")
    train(distill_config(tmp_path, tiny_dirs, resume=False), progress=False)
    (aside,) = run.glob("earlier-*")
    assert (aside / "metrics.jsonl").read_text() == old_metrics
    assert sorted(p.name for p in (aside / "checkpoints").glob("step-*"))[-1] == "step-0000006"
    assert (aside / "best" / "best.json").is_file() and (aside / "best" / "config.json").is_file()
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 2, 4]  # the new run alone, from step 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == \
        ["step-0000002", "step-0000004"]
    (run / "checkpoints" / ".step-0000006.x1.tmp").mkdir()  # what a kill mid-write leaves
    train(distill_config(tmp_path, tiny_dirs, max_steps=6), progress=False)  # resumes the new run
    assert not list((run / "checkpoints").glob(".step-*"))
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] \
        == [0, 2, 4, 6]


def test_accumulated_micro_batches_weigh_by_their_tokens(tmp_path, tiny_dirs):
    """grad_accum=4 x 1 row is one step over the same 4 rows as 1 x 4 rows: the same mean over
    their tokens (rows of different lengths must not count equally)."""
    from draftkit.distill.trainer import train

    losses = []
    for name, batch, accum in (("one", 4, 1), ("four", 1, 4)):
        train(distill_config(tmp_path, tiny_dirs, name, max_steps=1, **{
            "train.batch_size": batch, "train.grad_accum": accum, "eval.every": 1}),
            progress=False)
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        losses.append(json.loads(lines[-1])["loss"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_a_kill_before_the_first_checkpoint_or_inside_a_best_write_is_undone(tmp_path,
                                                                             tiny_dirs):
    from draftkit.distill.trainer import train

    run = tmp_path / "run"
    cfg = distill_config(tmp_path, tiny_dirs, **{"train.checkpoint_every": 4, "eval.every": 1})
    train(cfg, stop_after=3, progress=False)  # killed with no checkpoint written yet
    train(cfg, progress=False)
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4]  # the first attempt's lines are not kept twice
    # killed between atomic_dir's two renames: the old best/ set aside, the new one unplaced
    (run / "best").rename(run / ".best.old-4242")
    (run / ".best.abc.tmp").mkdir()
    (run / ".config.yaml.xyz.tmp").write_text("half a yaml")  # a kill inside a file write
    (run / "checkpoints" / ".step-0000004.old-77").mkdir()  # a replaced checkpoint's leftover
    train(distill_config(tmp_path, tiny_dirs, max_steps=5, **{"train.checkpoint_every": 4,
                                                             "eval.every": 1}), progress=False)
    assert (run / "best" / "model.safetensors").is_file()
    assert not list(run.glob(".*")) and not list((run / "checkpoints").glob(".*"))


def test_a_recipe_that_fails_to_start_leaves_the_earlier_run_as_it_was(tmp_path, tiny_dirs):
    from draftkit.distill.trainer import train
    from draftkit.models import load_model

    run = tmp_path / "run"
    train(distill_config(tmp_path, tiny_dirs, max_steps=2), progress=False)
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    too_long = load_model(str(tiny_dirs[0]), device="cpu").config.max_position_embeddings + 1
    for resume in (True, False):
        with pytest.raises(DraftkitError, match="longer than the target's context window"):
            train(distill_config(tmp_path, tiny_dirs, resume=resume, **{"data.seq_len": too_long}),
                  progress=False)
        assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*")
                if p.is_file()} == before  # config.yaml too: it still says what was trained


def test_a_resumed_run_logs_to_the_same_wandb_run(tmp_path, tiny_dirs, monkeypatch):
    from draftkit.distill.trainer import train

    monkeypatch.setenv("WANDB_MODE", "offline")
    run = tmp_path / "run"
    train(distill_config(tmp_path, tiny_dirs), stop_after=2, progress=False)
    train(distill_config(tmp_path, tiny_dirs), progress=False)
    # offline-run-<time>-<id>, and "-1" after it when both runs started within one second
    ids = {p.name.split("-")[3] for p in (run / "wandb").glob("offline-run-*")}
    assert len(list((run / "wandb").glob("offline-run-*"))) == 2
    assert ids == {(run / "wandb_run_id").read_text()}
    train(distill_config(tmp_path, tiny_dirs, resume=False), progress=False)  # a new run, a new id
    assert (run / "wandb_run_id").read_text() not in ids
    # a run killed after W&B started but before its first evaluation holds only its id
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "wandb_run_id").write_text("0123456789ab")
    train(distill_config(tmp_path, tiny_dirs, "fresh", resume=False, max_steps=1), progress=False)
    assert (fresh / "wandb_run_id").read_text() != "0123456789ab"


def test_resuming_with_other_batching_is_refused(tmp_path, tiny_dirs):
    """The data position means other rows under another batch size or accumulation."""
    from draftkit.distill.trainer import train

    train(distill_config(tmp_path, tiny_dirs, max_steps=2), progress=False)
    with pytest.raises(DraftkitError, match="trained with train.batch_size=2, "
                                            "train.grad_accum=2 on 1 process"):
        train(distill_config(tmp_path, tiny_dirs, **{"train.grad_accum": 1}), progress=False)
    train(distill_config(tmp_path, tiny_dirs), progress=False)  # the same batching resumes


def test_a_resume_follows_the_recipes_changed_lr_and_max_steps_and_says_so(tmp_path, tiny_dirs,
                                                                          capsys):
    """The optimizer's state carries the lr it was saved with; a recipe that changed it, or
    lengthened the run, must not be silently overridden by the checkpoint."""
    from draftkit.distill.checkpoint import list_checkpoints, load_checkpoint
    from draftkit.distill.schedule import lr_factor
    from draftkit.distill.trainer import train

    train(distill_config(tmp_path, tiny_dirs), progress=False)
    capsys.readouterr()
    train(distill_config(tmp_path, tiny_dirs, max_steps=6, **{"train.lr": 2e-3}), progress=False)
    said = capsys.readouterr().out
    assert "train.lr=0.002 (was 0.01)" in said and "max_steps=6 (was 4)" in said
    state = load_checkpoint(list_checkpoints(tmp_path / "run" / "checkpoints")[-1])
    assert state["step"] == 6
    assert state["scheduler"]["base_lrs"] == [2e-3]
    # the lr the next step would use: the new peak on the new 6-step schedule
    assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(
        2e-3 * lr_factor(6, 1, 6, 0.1))
    assert state["optimizer_settings"]["train.lr"] == 2e-3
    train(distill_config(tmp_path, tiny_dirs, max_steps=8, **{"train.lr": 2e-3}), progress=False)
    assert "train.lr" not in capsys.readouterr().out  # unchanged values go unsaid


def test_nan_loss_stops_and_keeps_checkpoint(tmp_path, tiny_dirs, monkeypatch):
    from draftkit.distill import standalone, trainer

    real = standalone.micro_loss
    calls = {"n": 0}

    def poisoned(*a, **k):
        loss, n = real(*a, **k)
        calls["n"] += 1
        return (loss * float("nan") if calls["n"] > 6 else loss), n  # step 4 goes bad

    monkeypatch.setattr(standalone, "micro_loss", poisoned)
    with pytest.raises(DraftkitError, match="loss is nan at step 4.*step-0000002"):
        trainer.train(distill_config(tmp_path, tiny_dirs), progress=False)
    ckpts = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert ckpts == ["step-0000002"]


def test_a_finite_loss_with_overflowing_gradients_stops_too(tmp_path, tiny_dirs, monkeypatch):
    from draftkit.distill import standalone, trainer

    class Overflow(torch.autograd.Function):  # the loss as it is, its gradient infinite
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            return grad * float("inf")

    real, calls = standalone.micro_loss, {"n": 0}

    def poisoned(*a, **k):
        loss, n = real(*a, **k)
        calls["n"] += 1
        return (Overflow.apply(loss) if calls["n"] > 6 else loss), n  # step 4 goes bad

    monkeypatch.setattr(standalone, "micro_loss", poisoned)
    with pytest.raises(DraftkitError, match="gradient norm is (inf|nan) at step 4.*step-0000002"):
        trainer.train(distill_config(tmp_path, tiny_dirs), progress=False)
    assert [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()] == ["step-0000002"]


def test_a_damaged_newest_checkpoint_is_passed_over_and_named(tmp_path, tiny_dirs, capsys):
    """Corrupted bytes and a lost manifest.json behave the same: resume from the newest
    checkpoint that reads, say which was passed over, and end where an unbroken run ends."""
    from draftkit.distill.trainer import train

    cfg = distill_config(tmp_path, tiny_dirs, max_steps=6)
    ckpts = tmp_path / "run" / "checkpoints"
    train(cfg, stop_after=4, progress=False)  # checkpoints at steps 2 and 4
    state = ckpts / "step-0000004" / "state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    capsys.readouterr()
    train(cfg, progress=False)
    out, err = capsys.readouterr()
    assert "step-0000004 is corrupted (its bytes do not match manifest.json); passed over" in err
    assert "resuming from" in out and "step-0000002 (step 2)" in out
    train(distill_config(tmp_path, tiny_dirs, "unbroken", max_steps=6), progress=False)
    assert _same(_state(tmp_path / "run"), _state(tmp_path / "unbroken"))

    (ckpts / "step-0000006" / "manifest.json").unlink()  # now: step 4 whole, step 6 without
    train(distill_config(tmp_path, tiny_dirs, max_steps=8), stop_after=6, progress=False)
    out, err = capsys.readouterr()
    assert "step-0000006 has no manifest.json (damaged after it was written); passed over" \
        in err and "step-0000004 (step 4)" in out

    for path in ckpts.iterdir():  # none reads: an error, not a silent fresh start
        (path / "state.pt").write_bytes(b"junk")
    with pytest.raises(DraftkitError, match=r"no checkpoint in .* can be read; set resume=false"):
        train(cfg, progress=False)
    (ckpts).rename(tmp_path / "gone")
    train(cfg, stop_after=2, progress=False)
    with pytest.raises(DraftkitError, match="trained on other rows"):
        train(distill_config(tmp_path, tiny_dirs, **{"data.seq_len": 40}), progress=False)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_topk_cache_reused_and_close_to_online(tmp_path, tiny_dirs):
    from draftkit.distill.trainer import train

    cache = tmp_path / "cache"
    cached = {"teacher.mode": "cache", "teacher.top_k": 8, "teacher.cache_dir": str(cache)}
    train(distill_config(tmp_path, tiny_dirs, "c1", **cached), progress=False)
    (built,) = list(cache.iterdir())
    meta = json.loads((built / "meta.json").read_text())
    assert meta["bytes_per_token"] == 8 * 6 and meta["filled_rows"] == meta["rows"]
    stamp = (built / "logp.f16").stat().st_mtime_ns
    train(distill_config(tmp_path, tiny_dirs, "c2", **cached), progress=False)
    assert (built / "logp.f16").stat().st_mtime_ns == stamp  # read, not rebuilt


def test_a_damaged_teacher_cache_is_one_clear_error(tmp_path, tiny_dirs):
    from draftkit.distill.trainer import prepare, train

    cache = tmp_path / "cache"
    prepare(distill_config(tmp_path, tiny_dirs, **{"teacher.mode": "cache", "teacher.top_k": 8,
                                                   "teacher.cache_dir": str(cache)}),
            progress=False)
    (built,) = list(cache.iterdir())
    logp = built / "logp.f16"
    full = logp.stat().st_size
    with open(logp, "r+b") as f:  # meta.json still says complete: a disk that lost the tail
        f.truncate(full // 2)
    with pytest.raises(DraftkitError, match=f"teacher cache {built} is damaged \\(logp.f16 has "
                                            f"{full // 2} bytes, expected {full}\\); delete"):
        train(distill_config(tmp_path, tiny_dirs, "again", **{"teacher.mode": "cache",
                                                              "teacher.top_k": 8,
                                                              "teacher.cache_dir": str(cache)}),
              progress=False)


def test_cache_matches_online_teacher_with_full_support(tmp_path, tiny_dirs):
    """With top_k = V the cached sparse teacher gives the online teacher's loss."""
    from draftkit.distill.teacher import OnlineTeacher, TopKCache
    from draftkit.distill.standalone import micro_loss
    from draftkit.distill.trainer import batch_rows
    from draftkit.distill.teacher import MaskedLM
    import contextlib

    cfg, target, draft, rows = distill_loaded(tmp_path, tiny_dirs)
    v = target.config.vocab_size
    cache = TopKCache(tmp_path / "c", rows, v, 1.0, "k")
    cache.build(target, rows, 4, progress=False)
    cache.open()
    idx = batch_rows(0, len(rows), 3, 0)
    online, _ = micro_loss(MaskedLM(draft), OnlineTeacher(target, 1.0), rows, idx, cfg,
                           contextlib.nullcontext)
    cached, _ = micro_loss(MaskedLM(draft), cache, rows, idx, cfg, contextlib.nullcontext)
    assert cached.item() == pytest.approx(online.item(), rel=2e-3)


def test_a_cache_another_run_is_building_is_waited_for(tmp_path, tiny_dirs, capsys):
    """Two runs of the same target and rows share one cache: the second waits for the
    first's lock instead of writing the same files at once, then finds them complete."""
    import threading
    import time

    from filelock import FileLock

    from draftkit.data import build_rows
    from draftkit.distill.teacher import TopKCache
    from draftkit.models import load_model, load_tokenizer

    target_dir, _ = tiny_dirs
    target = load_model(str(target_dir), device="cpu", dtype="float32")
    rows, _ = build_rows(distill_config(tmp_path, tiny_dirs).data,
                         load_tokenizer(str(target_dir)), 0)
    cache = TopKCache(tmp_path / "c", rows, 8, 1.0, "k")
    (tmp_path / "c").mkdir()
    other = FileLock(tmp_path / "c" / "build.lock")
    other.acquire()  # the first run, mid-build
    waiter = threading.Thread(target=cache.build, args=(target, rows, 4, False))
    waiter.start()
    time.sleep(0.5)
    assert waiter.is_alive() and cache.filled_rows() == 0
    other.release()
    waiter.join(30)
    assert not waiter.is_alive() and cache.filled_rows() == len(rows)
    assert "another run is building it; waiting" in capsys.readouterr().out
    cache.open()


def test_freeze_and_lora(tmp_path, tiny_dirs):
    from draftkit.distill.trainer import train

    lora = {"enabled": True, "r": 4, "alpha": 8}
    cfg = distill_config(tmp_path, tiny_dirs, **{"draft.freeze": ["embeddings"], "max_steps": 2,
                                                 "draft.lora": lora})
    best = train(cfg, progress=False)
    w = _weights(best)
    assert not any("lora" in k for k in w)  # merged at export: a plain HF folder
    with pytest.raises(DraftkitError, match="matches no parameter"):
        train(distill_config(tmp_path, tiny_dirs, "bad", **{"draft.freeze": ["embedings"]}),
              progress=False)


def test_bad_inputs(tmp_path, tiny_dirs):
    from draftkit.distill.trainer import train

    with pytest.raises(DraftkitError, match="context window"):
        train(distill_config(tmp_path, tiny_dirs, **{"data.seq_len": 512}), progress=False)
    with pytest.raises(DraftkitError, match="longer than data.seq_len"):
        train(distill_config(tmp_path, tiny_dirs, **{"data.seq_len": 8}), progress=False)
    with pytest.raises(DraftkitError, match=r"teacher.top_k=500 is more than the target's 138"):
        train(distill_config(tmp_path, tiny_dirs,
                             **{"teacher.mode": "cache", "teacher.top_k": 500}), progress=False)


def test_on_policy_mix(tmp_path, tiny_dirs, monkeypatch):
    from draftkit.distill import onpolicy, trainer

    calls = []
    real = onpolicy.draft_rows

    def spy(*a, **k):
        rows = real(*a, **k)
        calls.append(rows)
        return rows

    monkeypatch.setattr(trainer, "draft_rows", spy)  # the name the loop calls
    cfg = distill_config(tmp_path, tiny_dirs, **{"data.regime": "on_policy", "data.lmbda": 0.5,
                                                 "data.generate.max_new_tokens": 4,
                                                 "data.generate.batch_size": 4})
    trainer.train(cfg, progress=False)
    expected = sum(onpolicy.is_on_policy(0, s, 0.5) for s in range(4))
    assert 0 < expected < 4
    assert len(calls) == expected * 2  # grad_accum micro-batches per on-policy step
    rows = calls[0]
    assert rows.input_ids.shape == (2, 48) and rows.loss_mask.any()


def test_an_on_policy_recipe_asks_its_engine_for_the_drafts_answers(tmp_path, tiny_dirs,
                                                                     monkeypatch):
    """``data.generate.engine: vllm``: each rank opens one engine for the draft's answers at its
    first on-policy step, asks it at every on-policy micro-batch, and closes it at the end.
    (tests/engines/test_vllm_onpolicy.py runs the engine itself against HF generate.)"""
    from draftkit.data.generate import answers_in_memory, engine_answers
    from draftkit.distill import trainer
    from draftkit.models import load_model

    opened, asked, closed = [], [], []

    class Engine:  # stands in for VllmDraftAnswers: answers as vLLM must, by draftkit's decoder
        def __init__(self, work_dir, dtype, context):
            opened.append((Path(work_dir).name, dtype, context))

        def answers(self, draft, prompts, *a):
            asked.append(len(prompts))
            return answers_in_memory(draft, prompts, *a)

        def close(self):
            closed.append(True)

    class TargetEngine:  # stands in for VllmAnswers: the target's answers, by draftkit's decoder
        def __init__(self, path, dtype, *a):
            self.model = load_model(str(path), device="cpu", dtype=dtype)

        def cache_tag(self):
            return "stand-in"

        def answers(self, prompts, *a):
            return engine_answers(self.model, prompts, *a)

    monkeypatch.setattr(trainer, "VllmDraftAnswers", Engine)
    monkeypatch.setattr(trainer, "VllmAnswers", TargetEngine)
    cfg = distill_config(tmp_path, tiny_dirs, **{"data.regime": "on_policy", "data.lmbda": 1.0,
                                                 "data.generate.engine": "vllm",
                                                 "data.generate.max_new_tokens": 4})
    best = trainer.train(cfg, progress=False)
    assert (best / "model.safetensors").is_file()
    assert opened == [("onpolicy-engine-rank0", "float32", cfg.data.seq_len + 8)]
    assert len(asked) == cfg.max_steps * cfg.train.grad_accum and all(asked)
    assert closed == [True]


def test_on_policy_answers_depend_on_the_seed_step_and_rank_not_the_global_rng():
    """A resumed run, on every rank, must draw the answers the killed one would have: under
    DDP a checkpoint kept rank 0's RNG only, so other ranks used to sample differently."""
    from draftkit.data import Rows
    from draftkit.distill.onpolicy import draft_rows
    from tests.helpers import make_llama, make_tokenizer

    tok = make_tokenizer()
    draft = make_llama(len(tok), num_layers=1, seed=3)
    prompts = [tok("<|im_start|>user write python code <|im_end|> <|im_start|>assistant ")
               ["input_ids"]] * 3
    rows = Rows(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.bool),
                torch.zeros(1, dtype=torch.long), ["code"], prompts=prompts,
                prompt_domains=[0, 0, 0])

    def answers(global_seed, rank, micro_step=5):
        torch.manual_seed(global_seed)
        random.seed(global_seed)
        out = draft_rows(draft, rows, 3, 0, micro_step, rank, 12, 1.0, 48, tok.pad_token_id,
                         [tok.eos_token_id])
        return out.input_ids.tolist()

    first = answers(1, rank=1)
    assert answers(2, rank=1) == first
    assert answers(1, rank=0) != first and answers(1, rank=1, micro_step=6) != first


def test_tokenizer_mismatch_is_clear(tmp_path, tiny_dirs):
    from draftkit.distill.trainer import train
    from tests.helpers import make_llama, make_tokenizer, save_model

    tok = make_tokenizer(extra_words=("zebra", "yak"))
    other = save_model(make_llama(len(tok), num_layers=1), tok, tmp_path / "other")
    cfg = distill_config(tmp_path, tiny_dirs, draft={"model": str(other)})
    with pytest.raises(DraftkitError, match="vocab_size|tokenizers differ"):
        train(cfg, progress=False)


def test_cross_entropy_control(tmp_path, tiny_dirs):
    from draftkit.distill.trainer import train

    train(distill_config(tmp_path, tiny_dirs, **{"loss.divergence": "ce", "max_steps": 2}),
          progress=False)
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 2 and 0 < last["loss"] < 20 and "alpha/code" in last


def test_draft_vocab_is_chosen_saved_exported_and_loaded(tmp_path, tiny_dirs):
    """draft.draft_vocab_size: best/ gets the target's most frequent tokens, the bundle carries
    them and the loaded draft decodes with them."""
    from draftkit.distill.trainer import train
    from draftkit.export.bundle import export_bundle
    from draftkit.models import load_model, load_pair
    from draftkit.models.reduced_head import FILE, ReducedHead, head_of

    cfg = distill_config(tmp_path, tiny_dirs, **{"draft.draft_vocab_size": 40, "max_steps": 2})
    best = train(cfg, progress=False)
    data = json.loads((best / FILE).read_text())
    assert len(data["token_ids"]) == 40 and 0 < data["coverage"] <= 1
    bundle = export_bundle(str(tiny_dirs[0]), str(best), tmp_path / "bundle",
                           dtype="float32")  # as trained: its alpha compares at 1e-4
    assert (bundle / "draft" / FILE).is_file()
    pair = load_pair(str(tiny_dirs[0]), str(bundle), device="cpu")
    assert head_of(pair.draft).ids.tolist() == data["token_ids"]
    # the held-out alpha that picked best/ is the one of the draft as it decodes, with its
    # 40 tokens (it was the whole head's: 0.60 where the served draft had 0.08)
    from draftkit.distill.distributed import Dist
    from draftkit.distill.evaluate import heldout_alpha, model_logits
    from draftkit.distill.trainer import _load_target, recipe_rows

    ref, tok, target = _load_target(cfg, "cpu")
    _, heldout = recipe_rows(cfg, tok, target, ref, Dist(), False)
    served = heldout_alpha(model_logits(pair.draft, "cpu"), model_logits(target, "cpu"),
                           heldout)["alpha"]
    v = target.config.vocab_size
    whole = heldout_alpha(model_logits(pair.draft, "cpu", head=ReducedHead(range(v), v)),
                          model_logits(target, "cpu"), heldout)["alpha"]
    assert json.loads((best / "best.json").read_text())["alpha"] == pytest.approx(served, abs=1e-4)
    assert served < whole
    # training on from that draft without draft.draft_vocab_size keeps its head, scored and
    # saved
    again = train(distill_config(tmp_path, tiny_dirs, out="again", max_steps=2,
                                 draft={"model": str(best)}), progress=False)
    assert json.loads((again / FILE).read_text())["token_ids"] == data["token_ids"]
    draft = load_model(str(again), "draft", device="cpu", dtype="float32")
    served = heldout_alpha(model_logits(draft, "cpu"), model_logits(target, "cpu"),
                           heldout)["alpha"]
    assert json.loads((again / "best.json").read_text())["alpha"] == pytest.approx(served,
                                                                                abs=1e-4)


def test_best_is_replaced_whole_with_its_vocabulary_and_evaluation(tmp_path, tiny_dirs,
                                                                   monkeypatch):
    """A kill while a new best/ is written leaves the old one, weights, vocabulary and
    best.json together: they are written in one folder and renamed in once."""
    from draftkit.distill.draft import export_draft
    from draftkit.distill.trainer import train
    from draftkit.models import load_model, load_tokenizer, resolve_model
    from draftkit.models.reduced_head import FILE, ReducedHead

    best = train(distill_config(tmp_path, tiny_dirs,
                                **{"draft.draft_vocab_size": 40, "max_steps": 2}), progress=False)
    before = {p.name: p.read_bytes() for p in best.iterdir()}
    assert {"best.json", FILE, "model.safetensors"} <= set(before)

    def killed(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(ReducedHead, "save", killed)
    ref = resolve_model(str(tiny_dirs[1]), "draft")
    with pytest.raises(KeyboardInterrupt):
        export_draft(load_model(ref, "draft", device="cpu"), load_tokenizer(ref, "draft"), best,
                     ReducedHead([0], 1, 1.0, "x"),
                     {"step": 99})
    assert {p.name: p.read_bytes() for p in best.iterdir()} == before
    assert not list(best.parent.glob(".best.*"))


def test_bf16_autocast_and_jsd(tmp_path, tiny_dirs):
    from draftkit.distill.trainer import train

    cfg = distill_config(tmp_path, tiny_dirs, **{"train.precision": "bf16", "max_steps": 2,
                                                 "loss.divergence": "jsd", "loss.beta": 0.3})
    train(cfg, progress=False)
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 2 and 0 < last["loss"] < float("inf")
    w = _weights(tmp_path / "run" / "best")
    assert all(t.dtype == torch.float32 for t in w.values())  # fp32 master weights exported


def test_max_minutes_stops_with_eval_and_checkpoint(tmp_path, tiny_dirs):
    from draftkit.distill.trainer import train

    train(distill_config(tmp_path, tiny_dirs, max_minutes=1e-6), progress=False)
    run = tmp_path / "run"
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1]  # the budget ran out during step 1: evaluated, then stopped
    assert (run / "checkpoints" / "step-0000001").is_dir()


def test_max_minutes_leaves_time_for_the_last_evaluation(tmp_path, tiny_dirs, monkeypatch):
    """On a fake clock where a step takes 10 s and an evaluation 30 s, a 90 s budget stops
    after step 2 (80 s used) rather than when 90 s have passed, which would have run step 4
    and its evaluation to 130 s."""
    import types

    import draftkit.distill.standalone as standalone
    import draftkit.distill.trainer as trainer

    clock = [0.0]

    def ticking(fn, s):
        def wrapped(*a, **k):
            clock[0] += s
            return fn(*a, **k)
        return wrapped

    monkeypatch.setattr(trainer, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(standalone, "micro_loss", ticking(standalone.micro_loss, 5.0))  # 2 a step
    monkeypatch.setattr(standalone, "heldout_alpha", ticking(standalone.heldout_alpha, 30.0))
    trainer.train(distill_config(tmp_path, tiny_dirs, max_steps=20, max_minutes=1.5),
                  progress=False)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 2]
    assert rows[-1]["minutes"] <= 1.5
    assert (tmp_path / "run" / "checkpoints" / "step-0000002").is_dir()
    # a resume skips the step-0 evaluation that measured what an evaluation costs: the
    # checkpoint carries it, so a 60 s budget does not run on to 90 s
    start = clock[0]
    trainer.train(distill_config(tmp_path, tiny_dirs, max_steps=20, max_minutes=1.0),
                  progress=False)
    assert clock[0] - start <= 60.0


def test_prepare_builds_the_answers_and_cache_a_run_then_only_reads(tmp_path, tiny_dirs,
                                                                    monkeypatch):
    """After prepare(), train() generates no answer and builds no cache row: a max_minutes
    budget (the quickstart's) goes to training steps."""
    from draftkit.data import generate
    from draftkit.distill import teacher
    from draftkit.distill.trainer import prepare, train

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join(ROW_WORDS[i:i + 4]),
                                           "domain": "code"}) + "\n" for i in range(8)))
    cfg = distill_config(tmp_path, tiny_dirs, **{
        "data.sources": [{"path": str(prompts)}], "data.regime": "target",
        "data.generate.max_new_tokens": 6, "teacher.mode": "cache", "teacher.top_k": 8,
        "teacher.cache_dir": str(tmp_path / "cache")})
    built = prepare(cfg, progress=False)
    assert built["rows"] > 0 and built["heldout_rows"] > 0
    meta = json.loads((built["teacher_cache"] / "meta.json").read_text())
    assert meta["filled_rows"] == meta["rows"] == built["rows"]

    def no_generation(model, prompts, *a, **k):  # where a run's answers are decoded
        assert not prompts, "train() generated answers prepare() had built"
        return iter(())

    build = teacher.TopKCache.build

    def only_read(self, *a, **k):
        assert self.filled_rows() == self.n_rows, "train() built cache rows prepare() had built"
        return build(self, *a, **k)

    monkeypatch.setattr(generate, "engine_answers", no_generation)
    monkeypatch.setattr(teacher.TopKCache, "build", only_read)
    best = train(cfg, progress=False)
    assert (best / "model.safetensors").is_file()


def test_distill_prepare_flag_builds_the_cache_and_trains_nothing(tmp_path, tiny_dirs, capsys):
    from draftkit.cli import main

    recipe, _ = tiny_recipe(tmp_path, tiny_dirs[0])
    out, cache = tmp_path / "run", tmp_path / "cache"
    over = [f"out_dir={out}", "teacher.mode=cache", "teacher.top_k=8",
            f"teacher.cache_dir={cache}"]
    assert main(["distill", str(recipe), *over, "--prepare"]) == 0
    said = capsys.readouterr().out
    assert "prepared" in said and f"train with: draftkit distill {recipe} {over[0]}" in said
    (built,) = cache.iterdir()
    meta = json.loads((built / "meta.json").read_text())
    assert meta["filled_rows"] == meta["rows"] > 0
    assert not (out / "best").exists() and not (out / "checkpoints").exists()
    assert main(["distill", str(recipe), "--prepare", "--dry-run"]) == 2
    assert "give one of them" in capsys.readouterr().err


def test_rows_longer_than_the_target_context_stop_train_and_prepare(tmp_path, tiny_dirs):
    from draftkit.distill.trainer import prepare, train
    from draftkit.models import load_model

    context = load_model(str(tiny_dirs[0]), device="cpu").config.max_position_embeddings
    cfg = distill_config(tmp_path, tiny_dirs, **{"data.seq_len": context + 1})
    for run in (train, prepare):
        with pytest.raises(DraftkitError, match=f"data.seq_len={context + 1} is longer than "
                                                f"the target's context window"):
            run(cfg, progress=False)


def test_rows_longer_than_the_draft_context_are_an_error(tmp_path, tiny_dirs):
    import shutil

    from draftkit.distill.trainer import train

    short = tmp_path / "short-draft"
    shutil.copytree(tiny_dirs[1], short)
    config = json.loads((short / "config.json").read_text())
    config["max_position_embeddings"] = 32
    (short / "config.json").write_text(json.dumps(config))
    cfg = distill_config(tmp_path, tiny_dirs,
                         **{"draft": {"model": str(short)}, "data.seq_len": 48})
    with pytest.raises(DraftkitError, match="data.seq_len=48 is longer than the draft's "
                                            "context window \\(32\\)"):
        train(cfg, progress=False)


@pytest.mark.parametrize("arch,extra", [
    ("Gemma2", {"final_logit_softcapping": 2.0, "head_dim": 8}),  # soft-capped
    ("Granite", {"logits_scaling": 8.0}),  # divided
    ("Cohere", {"logit_scale": 0.5}),  # multiplied
])
def test_the_teacher_sees_the_logits_the_model_returns(arch, extra):
    """The teacher calls the decoder and head directly, to skip prompt positions; what these
    architectures' forward does after the head must follow (a Gemma 2 target's distribution
    was off by logits up to 12)."""
    import transformers

    from draftkit.distill.teacher import MaskedLM

    torch.manual_seed(0)
    config = getattr(transformers, f"{arch}Config")(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **extra)
    model = getattr(transformers, f"{arch}ForCausalLM")(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.5)
    ids = torch.randint(0, 64, (2, 8))
    mask = torch.rand(2, 8) > 0.3
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits[mask]
        assert torch.allclose(MaskedLM(model)(ids, mask)[0], want, atol=1e-4)


def test_the_caches_follow_the_targets_weights_and_dtype(tmp_path):
    """Target answers and the top-k cache are keyed by the target: a folder rewritten in place
    with other weights, or the same weights in bf16, must not reuse the other's."""
    from draftkit.distill.trainer import target_id
    from draftkit.models import resolve_model
    from tests.helpers import make_llama, make_tokenizer, save_model

    tok, folder = make_tokenizer(), tmp_path / "target"
    model = make_llama(len(tok), seed=0)
    save_model(model, tok, folder)
    first = target_id(resolve_model(str(folder)), model)
    assert target_id(resolve_model(str(folder)), model) == first  # stable
    assert target_id(resolve_model(str(folder)), model.to(torch.bfloat16)) != first
    save_model(make_llama(len(tok), seed=123), tok, folder)
    assert target_id(resolve_model(str(folder)), model.float()) != first
    # a copy elsewhere (another node's) is the same target: its caches are shared
    import shutil

    copy = shutil.copytree(folder, tmp_path / "copy")
    assert target_id(resolve_model(str(copy)), model) == target_id(resolve_model(str(folder)),
                                                                   model)


def test_rerunning_a_finished_run_reports_nothing_to_its_wandb_run(tmp_path, tiny_dirs,
                                                                   monkeypatch):
    """Nothing to train: it wrote tokens_per_s 0 over the run's summary and logged best/ as
    a new artifact version of the same W&B run."""
    import draftkit.distill.trainer as trainer
    from draftkit.distill.trainer import train

    calls = []

    class Fake:
        def __init__(self, *a, **k):
            pass

        def log(self, *a, **k):
            pass

        def summary(self, values):
            calls.append(("summary", values))

        def log_artifact(self, *a, **k):
            calls.append(("artifact", a))

        def finish(self):
            pass

    monkeypatch.setattr(trainer, "Tracker", Fake)
    train(distill_config(tmp_path, tiny_dirs, max_steps=2), progress=False)
    assert [c[0] for c in calls] == ["summary", "artifact"] and calls[0][1]["tokens_per_s"] > 0
    calls.clear()
    train(distill_config(tmp_path, tiny_dirs, max_steps=2), progress=False)
    assert calls == []


def test_a_checkpoint_is_on_disk_before_its_name_points_at_it(tmp_path, monkeypatch):
    """After a power cut the renamed folder and its manifest could reach the disk before
    state.pt's data did, and the next start would call the newest checkpoint corrupted."""
    import os

    from draftkit.distill import checkpoint as ckpt
    from draftkit.distill.schedule import warmup_cosine
    from tests.helpers import make_llama

    synced, real = set(), os.fsync

    def spy(fd):
        st = os.fstat(fd)
        synced.add((st.st_dev, st.st_ino))
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    model = make_llama(40, num_layers=1)
    opt = torch.optim.AdamW(model.parameters())
    path = ckpt.save_checkpoint(tmp_path / "checkpoints", 1, model, opt,
                                warmup_cosine(opt, 1, 4, 0.1), {}, keep=2)

    def inode(p):
        return os.stat(p).st_dev, os.stat(p).st_ino
    assert inode(path / "state.pt") in synced and inode(path) in synced
    assert inode(path.parent) in synced  # the rename
