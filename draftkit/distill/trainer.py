"""The distillation loop: draft q is trained to match target p on packed rows.

    draftkit distill recipes/smollm2-135m-instruct_to_4layer/quickstart_tvd_topk.yaml
    torchrun --nproc_per_node 2 -m draftkit distill RECIPE.yaml      # DDP over gloo on CPU

One step: ``grad_accum`` micro-batches of whole rows, the chosen divergence on response
positions, AdamW with warmup + cosine, clipping. Every ``eval.every`` steps held-out alpha
per domain (with the step, the loss and the wall minutes so far, set-up included, summed over
resumed runs) goes to ``metrics.jsonl`` and W&B, and a new best alpha rewrites ``best/`` (a plain
HF model folder; LoRA merged). Every ``train.checkpoint_every`` steps an atomic checkpoint;
a rerun of the same command resumes from the newest one exactly. A NaN or inf loss stops the
run before anything is written, so the last good checkpoint stays the newest.

What a step's loss is, what evaluation measures and what ``best/`` holds is the draft kind's
(``draft.kind``): a standalone draft's (distill/standalone.py) as above, or an EAGLE-3 head's
(distill/eagle3.py: training-time test, alpha per unrolled position, best/ by tau).

The public entry point is :func:`train` (``train(cfg) -> Path`` of ``best/``). tokens/s in
the progress bar and W&B counts trained (response) tokens per second, all processes together.

Long: the loop and the state it checkpoints are one concept; the draft, data, teacher, losses,
evaluation and processes each live in a module of their own.
"""

from __future__ import annotations

import contextlib
import glob
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from draftkit.config import dump_yaml
from draftkit.data import Rows, build_rows, default_generation_dir
from draftkit.data.generate import (VllmAnswers, answer_stop_ids, cache_file,
                                    generate_responses)
from draftkit.distill import checkpoint as ckpt
from draftkit.distill.config import DistillConfig
from draftkit.distill.distributed import (Dist, all_reduce_mean, barrier, close_distributed,
                                          deepspeed_engine, gathered, init_distributed, zero_stage)
from draftkit.distill.draft import check_context, choose_draft_vocab, token_counts
from draftkit.distill.eagle3 import Eagle3
from draftkit.distill.onpolicy import VllmDraftAnswers, draft_rows, is_on_policy
from draftkit.distill.schedule import warmup_cosine
from draftkit.distill.standalone import Standalone
from draftkit.distill.teacher import cache_key, caches_of
from draftkit.errors import DraftkitError
from draftkit.io import append_jsonl, atomic_write_text, recover_writes
from draftkit.models import (default_device, dtype_name, load_model, load_tokenizer,
                             resolve_model)
from draftkit.models.facts import vocab_size
from draftkit.models.reduced_head import ReducedHead
from draftkit.models.resolve import model_identity
from draftkit.tracking import Tracker

# what a step's loss, evaluation and best/ are, by draft.kind
KINDS = {"standalone": Standalone, "eagle3": Eagle3}

# --- data order ---------------------------------------------------------------------------------

def batch_rows(micro_step: int, n_rows: int, batch_size: int, seed: int, rank: int = 0,
               world_size: int = 1) -> torch.Tensor:
    """Row indices of micro-batch ``micro_step`` for this rank.

    The rows form an endless stream of per-epoch permutations (seeded by epoch), so the data
    position is the micro-step alone: resuming needs nothing else. Each global batch is
    ``batch_size * world_size`` consecutive stream entries, split by rank.
    """
    width = batch_size * world_size
    start = micro_step * width + rank * batch_size
    out = []
    for flat in range(start, start + batch_size):
        epoch, offset = divmod(flat, n_rows)
        perm = torch.randperm(n_rows, generator=torch.Generator().manual_seed(seed * 100003 +
                                                                              epoch))
        out.append(int(perm[offset]))
    return torch.tensor(out, dtype=torch.long)


# --- the loop -----------------------------------------------------------------------------------

def train(cfg: DistillConfig, stop_after: int | None = None, progress: bool = True) -> Path:
    """Run a recipe; returns the ``best/`` folder. ``stop_after`` ends early as a kill would."""
    started = time.perf_counter()
    dist, device = _start_processes(cfg)
    out = Path(cfg.out_dir)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    # Models, rows and teacher first: a recipe that fails there leaves out_dir as it was.
    run = _Run(cfg, dist, device, out, started, progress)
    _open_out_dir(cfg, dist, out)
    run.resume()
    run.start_tracking()

    score = run.kind.score  # what picks best/: alpha, or an eagle3 head's tau
    run.draft.train()
    if run.step == 0:
        first = run.evaluate(None)
        if dist.is_main:
            print(f"held-out {score} before training: {run.kind.describe(first)}", flush=True)
    bar = None
    if progress and dist.is_main:
        bar = tqdm(total=cfg.max_steps, initial=run.step, desc="distill", unit="step",
                   dynamic_ncols=True)
    end = cfg.max_steps if stop_after is None else min(cfg.max_steps, stop_after)
    trains = run.step < end  # a rerun of a finished run trains nothing and reports nothing
    tokens_seen, t0, loss_value, tok_s = 0, time.perf_counter(), None, 0.0
    try:
        while run.step < end:
            t_step = time.perf_counter()
            loss_value, n_tokens = run.train_step()
            step = run.step
            tokens_seen += n_tokens
            run.seconds["step"] = time.perf_counter() - t_step
            if cfg.max_minutes is not None and all_reduce_mean(float(_out_of_time(
                    cfg.max_minutes, time.perf_counter() - started, run.seconds,
                    step % cfg.eval.every == 0, step % cfg.train.checkpoint_every == 0)),
                    dist) > 0:
                end = step  # evaluate and checkpoint now, while they fit, then stop
            tok_s = tokens_seen / max(1e-9, time.perf_counter() - t0)  # all ranks together
            if dist.is_main and step % cfg.train.log_every == 0:
                run.tracker.log({"loss": loss_value, "lr": run.lr,
                                 "tokens_per_s": tok_s}, step=step)
            last = step == cfg.max_steps or (step == end and stop_after is None)
            if step % cfg.eval.every == 0 or last:
                run.evaluate(loss_value)
            if step % cfg.train.checkpoint_every == 0 or last:
                run.save()
            if bar is not None:
                last = "None" if run.last_score is None else f"{run.last_score:.3f}"
                bar.set_postfix_str(f"loss {loss_value:.4f} | {tok_s:.0f} tok/s | {score} {last}")
                bar.update(1)
        if bar is not None:
            bar.close()
        if dist.is_main and trains and run.step == end and stop_after is None and \
                (out / "best").is_dir():
            if run.step < cfg.max_steps:
                print(f"stopped at step {run.step} of {cfg.max_steps}: max_minutes="
                      f"{cfg.max_minutes:g} ran out", flush=True)
            run.tracker.summary({f"best_{score}": run.best_score, "tokens_per_s": tok_s})
            run.tracker.log_artifact(out / "best", name=f"draft-{out.name}", type="model",
                                     aliases=["best"], metadata={score: run.best_score})
            print(f"best held-out {score} {run.best_score:.4f}; draft in {out / 'best'}",
                  flush=True)
    finally:
        if bar is not None:
            bar.close()
        run.tracker.finish()
        if run.onpolicy_engine is not None:
            run.onpolicy_engine.close()
    close_distributed(dist)
    return out / "best"


def _start_processes(cfg: DistillConfig) -> tuple[Any, str]:
    """(this process's place among the run's processes, the device it trains on): under DDP
    on GPUs each process takes the GPU of its local rank."""
    device = default_device() if cfg.train.device == "auto" else cfg.train.device
    dist = init_distributed(device)
    if device.startswith("cuda") and dist.world_size > 1:
        device = f"cuda:{dist.local_rank}"
    return dist, device


def _open_out_dir(cfg: DistillConfig, dist: Any, out: Path) -> None:
    """Rank 0 readies out_dir: what a killed write left behind recovered, an earlier run set
    aside under ``resume=false``, the resolved config written; then every rank waits for it."""
    if dist.is_main:
        out.mkdir(parents=True, exist_ok=True)
        # first what a kill inside a write left behind, so an earlier run set aside is whole
        recover_writes(out, [glob.escape(name) for name in ckpt.RUN_FILES])
        recover_writes(out / "checkpoints")
        aside = None if cfg.resume else ckpt.set_aside_earlier_run(out)
        if aside is not None:
            print(f"resume=false: moved the earlier run in {out} to {aside}", flush=True)
        dump_yaml(cfg, out / "config.yaml")  # the resolved config, overrides applied
    barrier(dist)  # no rank looks for checkpoints before the earlier run is set aside


class _Run:
    """One process's share of a run: the models, rows, teacher and optimizer it set up, and
    the state a checkpoint keeps (step, best and latest alpha, minutes so far)."""

    def __init__(self, cfg: DistillConfig, dist: Any, device: str, out: Path, started: float,
                 progress: bool):
        self.cfg, self.dist, self.out, self.started = cfg, dist, out, started
        target, target_ref = self._load_models(device)
        key = self._build_data(target, target_ref, progress)
        self._choose_draft_vocab(target)
        self._start_draft(target, key, device, progress)
        self._build_optimizer()
        self._start_state()

    def _load_models(self, device: str) -> tuple[Any, Any]:
        """The target and its tokenizer, then the draft kind, whose checks (a standalone
        draft's whole model) come before any answer is made: (target, its reference)."""
        target_ref, self.tokenizer, target = _load_target(self.cfg, device)
        self.kind: Any = KINDS[self.cfg.draft.kind](self.cfg, target, self.tokenizer, target_ref,
                                                    device)
        return target, target_ref

    def _build_data(self, target: Any, target_ref: Any, progress: bool) -> str:
        """The training and held-out rows (the target's answers made or read from their
        cache); returns the key the answer and teacher caches are keyed by."""
        # what the answer and teacher caches are keyed by, and where answers end: once
        key, self.stop_ids = target_id(target_ref, target), answer_stop_ids(target, self.tokenizer)
        self.rows, self.heldout = recipe_rows(self.cfg, self.tokenizer, target, target_ref,
                                              self.dist, progress, key, self.stop_ids)
        return key

    def _choose_draft_vocab(self, target: Any) -> None:
        """The reduced head the draft decodes with, if any: scored with it and saved with it."""
        cfg = self.cfg
        self.reduced_head = None
        v = vocab_size(target)
        kept = self.kind.kept_head  # a draft.model folder that has one
        if cfg.draft.draft_vocab_size:
            self.reduced_head = choose_draft_vocab(cfg.draft.draft_vocab_size, self.rows,
                                                   self.heldout, self.tokenizer, v)
        elif kept is not None:
            self.reduced_head = ReducedHead(kept.ids, v, source=f"{cfg.draft.model}")
            self.reduced_head.covered = self.reduced_head.coverage(token_counts(self.heldout, v))
        if self.reduced_head is not None and self.dist.is_main:
            print(f"draft vocabulary: {len(self.reduced_head)} tokens cover "
                  f"{self.reduced_head.covered:.1%} of the held-out target tokens"
                  + (self._vocab_note(kept) if cfg.draft.draft_vocab_size else
                     " (the head's own: a warm start keeps it; set draft.draft_vocab_size to "
                     "choose again)" if cfg.draft.kind == "eagle3" else " (the draft's own; set "
                     "draft.draft_vocab_size to choose again)"), flush=True)

    def _vocab_note(self, kept: Any) -> str:
        """How much of a warm-started head's vocabulary a new choice keeps."""
        if kept is None:
            return ""
        same = int((kept.index.cpu()[self.reduced_head.ids.cpu()] >= 0).sum())
        return f" ({same} of them the warm-started head's, which keep their trained rows)"

    def _start_draft(self, target: Any, key: str, device: str, progress: bool) -> None:
        """The draft on its device and the teacher that scores its rows (a cache the draft
        kind fills on its first run)."""
        tok = self.tokenizer
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.autocast = (lambda: torch.autocast(device.split(":")[0], dtype=torch.bfloat16)) \
            if self.cfg.train.precision == "bf16" else contextlib.nullcontext
        self.kind.start(target, key, self.rows, self.reduced_head, self.dist, progress,
                        self.autocast)
        self.draft, self.teacher = self.kind.draft, self.kind.teacher
        self.onpolicy_engine = None  # the draft's answers in vLLM, made at its first use

    def _build_optimizer(self) -> None:
        """The trained module (DDP-wrapped over several processes), its optimizer and lr
        schedule, or the DeepSpeed engine that owns them."""
        cfg, student = self.cfg, self.kind.student
        if self.dist.world_size > 1 and not cfg.train.deepspeed:
            student = torch.nn.parallel.DistributedDataParallel(student)
        self.params = [p for p in self.draft.parameters() if p.requires_grad]
        if not self.params:
            raise DraftkitError("every draft parameter is frozen; shorten draft.freeze")
        self.stage = zero_stage(cfg)
        self.student, self.engine, self.optimizer, self.scheduler = _optimizer(
            cfg, student, self.params)

    def _start_state(self) -> None:
        """The state a checkpoint keeps, as at step 0 (:meth:`resume` brings a saved one)."""
        cfg = self.cfg
        # the held-out score (kind.score) that picked best/, and the latest one
        self.step, self.best_score, self.last_score, self.prior_minutes = 0, -1.0, None, 0.0
        # the data position only means these rows: a checkpoint of other rows cannot resume
        self.data_key = cache_key("rows", self.rows, 0, 0.0)
        # so is the order they are drawn in: rows per micro-batch, per step, per process
        self.batching = [cfg.train.batch_size, cfg.train.grad_accum, self.dist.world_size]
        self.ckpt_dir = self.out / "checkpoints"
        self.seconds = {"step": 0.0, "eval": 0.0, "checkpoint": 0.0}  # latest, for max_minutes
        self.lr = cfg.train.lr  # the latest step's learning rate, for the log
        self.tracker: Any = _NoTracker()

    def start_tracking(self) -> None:
        """W&B on rank 0 (a resumed run continues its W&B run), with the caches' sizes."""
        cfg, dist, out = self.cfg, self.dist, self.out
        self.tracker = Tracker("distill", cfg, name=cfg.wandb.name, group=cfg.wandb.group,
                               out_dir=out, project=cfg.wandb.project,
                               run_id=ckpt.wandb_run_id(out)) if dist.is_main else _NoTracker()
        for cache in self.kind.caches if dist.is_main else ():
            self.tracker.summary({f"{cache.what.replace(' ', '_')}/bytes_per_token":
                                  cache.bytes_per_token})
            print(f"{cache.what}: {cache.bytes_per_token:.0f} bytes per token, "
                  f"{cache.total_bytes / 1e6:.1f} MB in {cache.dir}", flush=True)

    def minutes(self) -> float:
        """Wall minutes of this out_dir's runs so far, set-up included."""
        return self.prior_minutes + (time.perf_counter() - self.started) / 60

    def resume(self) -> None:
        """Continue from the newest checkpoint in out_dir, exactly, if there is one."""
        cfg, dist = self.cfg, self.dist

        def load(path: Path) -> dict:
            if self.engine is not None:
                return ckpt.load_deepspeed_checkpoint(self.engine, path, dist.rank)
            return ckpt.load_checkpoint(path)

        def say(line: str) -> None:
            if dist.is_main:
                print(f"warning: {line}", file=sys.stderr, flush=True)

        found = ckpt.newest_state(self.ckpt_dir, load, say) if cfg.resume else None
        if found is None:  # a run killed before its first checkpoint starts over, its lines too
            if dist.is_main:
                _truncate_metrics(self.out / "metrics.jsonl", -1)
            return
        path, state = found
        self._same_draft(state, path)  # before its weights meet this draft's
        if self.engine is None:
            ckpt.restore(state, self.draft, self.optimizer, self.scheduler)
        if state.get("data_key") not in (None, self.data_key):
            raise DraftkitError(f"{path} was trained on other rows (the data, seq_len or "
                                f"seed changed); resuming would not be exact: use another "
                                f"out_dir or set resume=false{ckpt.QUICKSTART_FRESH}")
        if state.get("batching") not in (None, self.batching):
            b, a, w = state["batching"]
            raise DraftkitError(f"{path} was trained with train.batch_size={b}, "
                                f"train.grad_accum={a} on {w} process(es); other values would "
                                f"draw other rows from here: set them back, or use another "
                                f"out_dir or resume=false{ckpt.QUICKSTART_FRESH}")
        score = self.kind.score
        self.step, self.best_score = state["step"], state[f"best_{score}"]
        self.last_score = state.get(f"last_{score}")
        self._follow_recipe(state.get("optimizer_settings", {}))
        # minutes in metrics.jsonl count every run of this out_dir, not just this one
        self.prior_minutes = state.get("minutes", 0.0)
        self.seconds.update(state.get("seconds") or {})
        if dist.is_main:
            _truncate_metrics(self.out / "metrics.jsonl", self.step)
            print(f"resuming from {path} (step {self.step})", flush=True)
            if self.step >= cfg.max_steps:
                print(f"step {self.step} already reaches max_steps={cfg.max_steps}: nothing "
                      f"to train; raise max_steps to continue", flush=True)

    def _same_draft(self, state: dict, path: Path) -> None:
        """A checkpoint of another draft kind, or of an eagle3 head on other layers or another
        draft vocabulary, cannot resume this recipe (layers load without a shape to refuse)."""
        saved, now = state.get("draft_kind"), self.kind.identity
        if saved != now:
            raise DraftkitError(f"{path} holds {_draft_words(saved)}; this recipe trains "
                                f"{_draft_words(now)}: use another out_dir or set resume=false"
                                f"{ckpt.QUICKSTART_FRESH}")

    def optimizer_settings(self) -> dict:
        """The recipe's optimizer and schedule values, which a checkpoint records."""
        t = self.cfg.train
        return {"train.lr": t.lr, "train.betas": list(t.betas),
                "train.weight_decay": t.weight_decay, "train.warmup_steps": t.warmup_steps,
                "train.min_lr_ratio": t.min_lr_ratio, "max_steps": self.cfg.max_steps}

    def _follow_recipe(self, saved: dict) -> None:
        """The optimizer's state brings back the lr, betas and weight decay it was saved with;
        the recipe's values win from the resumed step on (the lr is the recipe's schedule at
        this step: a longer max_steps puts it back up the longer cosine, a new lr rescales it),
        and a changed value is said, not silent."""
        t, now = self.cfg.train, self.optimizer_settings()
        changed = [f"{k}={now[k]} (was {saved[k]})" for k in now
                   if k in saved and saved[k] != now[k]]
        if self.dist.is_main and self.step < self.cfg.max_steps and (changed or not saved):
            what = ", ".join(changed) if saved else "a checkpoint that does not record them"
            print(f"resuming with {what}: the recipe's lr, betas, weight decay and schedule "
                  f"apply from step {self.step}", flush=True)
        # the scheduler's own lr_lambdas were built from this recipe; only its base came back
        for group, factor in zip(self.optimizer.param_groups, self.scheduler.lr_lambdas):
            group.update(initial_lr=t.lr, lr=t.lr * factor(self.step), betas=tuple(t.betas),
                         weight_decay=t.weight_decay)
        self.scheduler.base_lrs = [t.lr] * len(self.optimizer.param_groups)

    def train_step(self) -> tuple[float, int]:
        """One optimizer step over ``grad_accum`` micro-batches on every rank; (loss, trained
        tokens of all ranks). The loss is the mean over all the step's trained tokens, as one
        large batch would give: each micro-batch weighs by its tokens, not equally."""
        cfg, dist, accum = self.cfg, self.dist, self.cfg.train.grad_accum
        self.lr = self.optimizer.param_groups[0]["lr"]  # before the scheduler moves it on
        batches = [self._micro_batch(self.step * accum + micro) for micro in range(accum)]
        local = sum(int(rows.loss_mask[idx].sum()) for rows, idx, _ in batches)
        trained = round(all_reduce_mean(float(local), dist) * dist.world_size)  # every rank's
        step_tokens = max(float(trained), 1.0)
        total = 0.0
        for micro, (rows, idx, source) in enumerate(batches):
            sync = contextlib.nullcontext()
            if self.engine is None and hasattr(self.student, "no_sync") and micro < accum - 1:
                sync = self.student.no_sync()  # all-reduce gradients once per step
            with sync:
                loss, n = self.kind.loss(self.student, source, rows, idx)
                # its share of the step's mean, times the ranks: DDP averages over them
                share = loss * (n * dist.world_size / step_tokens)
                # Checked before backward: a bad loss must never reach the weights.
                value = all_reduce_mean(float(share.detach()), dist)
                if not math.isfinite(value):
                    _stop_on_bad_loss(value, self.step, ckpt.list_checkpoints(self.ckpt_dir))
                if self.engine is not None:
                    self.engine.backward(share * accum)  # DeepSpeed divides by grad_accum
                    self.engine.step()  # updates only at the accumulation boundary
                else:
                    share.backward()
            total += value
        if self.engine is None:
            clip = cfg.train.max_grad_norm if cfg.train.max_grad_norm > 0 else float("inf")
            norm = float(torch.nn.utils.clip_grad_norm_(self.params, clip))
            if not math.isfinite(norm):  # a finite loss can still overflow on the way back
                _stop_on_bad_loss(norm, self.step, ckpt.list_checkpoints(self.ckpt_dir),
                                  "gradient norm")
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return total, trained

    def _micro_batch(self, m: int) -> tuple[Rows, torch.Tensor, Any]:
        """Micro-batch ``m`` of this rank: (rows, their indices, the teacher that scores them).
        On-policy steps draw the draft's own answers, scored by the target now."""
        cfg, dist = self.cfg, self.dist
        if not is_on_policy(cfg.seed, self.step, cfg.data.lmbda):
            return self.rows, batch_rows(m, len(self.rows), cfg.train.batch_size, cfg.seed,
                                         dist.rank, dist.world_size), self.teacher
        g = cfg.data.generate
        if self.kind.rollouts is not None:  # an EAGLE-3 head drafts while the target decodes
            rows, teacher = self.kind.rollouts.draw(
                self.draft, self.rows, cfg.train.batch_size, cfg.seed, m, dist.rank,
                g.max_new_tokens, g.on_policy, cfg.data.seq_len, self.pad_id)
            return rows, torch.arange(len(rows)), teacher
        if g.engine == "vllm" and self.onpolicy_engine is None:  # this rank's own engine
            self.onpolicy_engine = VllmDraftAnswers(
                Path(cfg.out_dir) / f"onpolicy-engine-rank{dist.rank}", "float32",
                cfg.data.seq_len + 8)
        whole = gathered(self.draft, self.stage) if self.onpolicy_engine is not None else \
            contextlib.nullcontext()  # ZeRO-3: the whole weights, which the engine loads
        with whole:
            rows = draft_rows(self.draft, self.rows, cfg.train.batch_size, cfg.seed, m,
                              dist.rank, g.max_new_tokens, g.on_policy, cfg.data.seq_len,
                              self.pad_id, self.stop_ids, self.reduced_head,
                              self.onpolicy_engine)
        return rows, torch.arange(len(rows)), self.kind.online

    def evaluate(self, loss_value: float | None) -> dict:
        """Held-out alpha per domain (and what the draft kind adds) to metrics.jsonl and W&B;
        a new best score (kind.score) rewrites best/."""
        t, dist = time.perf_counter(), self.dist
        self.draft.eval()
        metrics = self.kind.evaluate(self.heldout)
        self.draft.train()
        # every rank evaluates the same rows; the mean makes the decision below bitwise the
        # same on all of them (ZeRO-3's gather for the export is a collective)
        self.last_score = all_reduce_mean(metrics[self.kind.score], dist)
        row = {"step": self.step, "loss": loss_value, "minutes": round(self.minutes(), 3),
               **metrics}
        if dist.is_main:
            append_jsonl(self.out / "metrics.jsonl", row)
            self.tracker.log(metrics, step=self.step)
        if self.last_score > self.best_score:
            self.best_score = self.last_score
            with gathered(self.draft, self.stage):
                if dist.is_main:
                    self.kind.export(self.out / "best", row)
        self.seconds["eval"] = time.perf_counter() - t
        return row

    def save(self) -> None:
        """An atomic checkpoint of everything an exact resume needs."""
        t, keep = time.perf_counter(), self.cfg.train.keep_checkpoints
        score = self.kind.score
        extra = {f"best_{score}": self.best_score, f"last_{score}": self.last_score,
                 "data_key": self.data_key, "batching": self.batching,
                 "optimizer_settings": self.optimizer_settings(),
                 "minutes": self.minutes(),
                 # max_minutes' estimates: a resume skips the step-0 evaluation that measures them
                 "seconds": dict(self.seconds)}
        if self.kind.identity is not None:  # a standalone checkpoint stays as it was
            extra["draft_kind"] = self.kind.identity
        if self.engine is not None:
            ckpt.save_deepspeed_checkpoint(self.engine, self.ckpt_dir, self.step, extra, keep,
                                           self.dist.rank)
        elif self.dist.is_main:
            ckpt.save_checkpoint(self.ckpt_dir, self.step, self.draft, self.optimizer,
                                 self.scheduler, extra, keep)
        barrier(self.dist)
        self.seconds["checkpoint"] = time.perf_counter() - t


def _optimizer(cfg: DistillConfig, student: Any, params: list) -> tuple[Any, Any, Any, Any]:
    """(student, DeepSpeed engine or None, optimizer, scheduler): AdamW with warmup + cosine,
    or the engine of ``train.deepspeed``, which then owns accumulation, clipping, bf16 and the
    schedule's stepping."""
    if cfg.train.deepspeed:
        engine, optimizer, scheduler = deepspeed_engine(
            student, params, cfg.train.deepspeed, cfg.train, cfg.max_steps,
            cfg.train.warmup_steps, cfg.train.min_lr_ratio)
        return engine, engine, optimizer, scheduler
    optimizer = torch.optim.AdamW(params, lr=cfg.train.lr, betas=tuple(cfg.train.betas),
                                  weight_decay=cfg.train.weight_decay)
    return student, None, optimizer, warmup_cosine(optimizer, cfg.train.warmup_steps,
                                                   cfg.max_steps, cfg.train.min_lr_ratio)


def prepare(cfg: DistillConfig, progress: bool = True) -> dict:
    """Build what a run reads before its first step and keeps on disk for later runs: the
    target's answers (``data.regime`` target) and the top-k teacher cache (``teacher.mode``
    cache). A :func:`train` of the same recipe then starts training at once, so a
    ``max_minutes`` budget buys steps, not set-up. One process; returns what was built.
    """

    device = default_device() if cfg.train.device == "auto" else cfg.train.device
    target_ref, tokenizer, target = _load_target(cfg, device)
    dist = Dist()  # one process
    key = target_id(target_ref, target)
    kind = KINDS[cfg.draft.kind]
    train_rows, heldout = recipe_rows(cfg, tokenizer, target, target_ref, dist, progress, key)
    caches = {c.what: c.dir for c in caches_of(kind.make_teacher(cfg, target, key, train_rows,
                                                                 dist, progress))}
    return {"rows": len(train_rows), "heldout_rows": len(heldout),
            "teacher_cache": caches.get("teacher cache"),
            "feature_cache": caches.get("feature cache")}


def _load_target(cfg: DistillConfig, device: str) -> tuple[Any, Any, Any]:
    """(reference, tokenizer, model) of the recipe's target; rows longer than its context
    window are an error here, before any answer is generated."""
    target_ref = resolve_model(cfg.target, "target")
    tokenizer = load_tokenizer(target_ref, "target")
    target = load_model(target_ref, "target", device=device, dtype=cfg.teacher.dtype)
    check_context(target.config, cfg.data.seq_len, "target")
    return target_ref, tokenizer, target


def _out_of_time(max_minutes: float, elapsed: float, seconds: dict[str, float],
                 evaluates: bool, checkpoints: bool) -> bool:
    """Whether to stop after this step so that the run ends within ``max_minutes``.

    Going on costs this step's due evaluation and checkpoint, if any, one more step, then the
    final evaluation and checkpoint; each is timed by the latest one of its kind.
    """
    ahead = (seconds["step"] + (1 + evaluates) * seconds["eval"]
             + (1 + checkpoints) * seconds["checkpoint"])
    return elapsed + ahead > 60 * max_minutes


def _stop_on_bad_loss(value: float, step: int, kept: list[Path], what: str = "loss") -> None:
    where = f"the last good checkpoint is {kept[-1]}" if kept else "no checkpoint was written yet"
    raise DraftkitError(f"{what} is {value} at step {step + 1}; stopped without saving ({where}); "
                        f"lower train.lr, raise train.warmup_steps or use train.precision=fp32")


class _NoTracker:
    def log(self, *a, **k): ...
    def summary(self, *a, **k): ...
    def log_artifact(self, *a, **k): ...
    def finish(self): ...


def _draft_words(identity: dict | None) -> str:
    """A draft kind's identity (kind.identity) in words."""
    if identity is None:
        return "a standalone draft"
    kind = "a parallel eagle3 head" if identity.get("parallel") else "an eagle3 head"
    if identity.get("num_layers", 1) > 1:
        kind += f" of {identity['num_layers']} layers"
    return (f"{kind} over {identity['draft_vocab_size']} tokens reading layers "
            f"{identity['aux_layers']}")


def _truncate_metrics(path: Path, step: int) -> None:
    """Evaluations after the resumed checkpoint will run again: drop their old lines."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= step:
                keep.append(line)
        except (json.JSONDecodeError, KeyError):
            continue
    atomic_write_text(path, "".join(line + "\n" for line in keep))


def target_id(target_ref: Any, target: Any) -> str:
    """What the caches of target answers and top-k log-probs are keyed by: the target's
    weights (:func:`~draftkit.models.resolve.model_identity`) and the dtype it runs in, since a
    bf16 target's answers and top-k are not an fp32 one's."""
    return f"{model_identity(target_ref)}|{next(target.parameters()).dtype}"


def recipe_rows(cfg: DistillConfig, tokenizer: Any, target: Any, target_ref: Any, dist: Any,
                progress: bool, key: str | None = None,
                stop_ids: list[int] | None = None) -> tuple[Rows, Rows]:
    """Packed rows; target answers are generated by rank 0 first, then read from its cache.
    ``key`` (:func:`target_id`) and ``stop_ids`` (``answer_stop_ids``), when the caller has
    them already, spare computing them again."""
    g = cfg.data.generate
    gen_dir = Path(g.cache_dir) if g.cache_dir else default_generation_dir()

    key = key or target_id(target_ref, target)
    stop_ids = answer_stop_ids(target, tokenizer) if stop_ids is None else stop_ids
    engine = None
    if g.engine == "vllm":  # answered by vLLM, in its own environment; cached apart
        engine = VllmAnswers(target_ref.path, dtype_name(target), g.tensor_parallel_size,
                             g.replicas)
        key = f"{key}|{engine.cache_tag()}"

    def generate(prompts, temperature, seed):
        path = cache_file(gen_dir, key, g.max_new_tokens, temperature, seed, stop_ids)
        return generate_responses(target, tokenizer, prompts, path, g.max_new_tokens,
                                  g.batch_size, temperature, seed,
                                  progress=progress and dist.is_main, stop_ids=stop_ids,
                                  engine=engine)

    if dist.world_size > 1 and cfg.data.regime != "fixed":
        if dist.is_main:
            build_rows(cfg.data, tokenizer, cfg.seed, generate, stop_ids)
        barrier(dist)
    return build_rows(cfg.data, tokenizer, cfg.seed, generate, stop_ids)
