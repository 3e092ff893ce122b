"""The evaluation commands, each an args dataclass and the plain function the CLI calls.

``draftkit eval``: alpha, tau, c, predicted and measured speedup per domain::

    draftkit eval --target embedded --draft runs/quickstart/bundle --out runs/eval
    draftkit eval --target embedded --draft D --baseline-draft D0 --limit 10 --k 3

``draftkit regimes``: where speculation stops paying for this target, draft and traffic
(:mod:`draftkit.evaluate.regimes`)::

    draftkit regimes --out runs/regimes                     # embedded target, derived drafts
    draftkit regimes --target T --draft runs/quickstart/bundle --domains code math creative
    draftkit regimes --target T --draft D --drafts-by-domain code=D_code math=D_math

Each writes ``report.json``, ``report.md``, ``report.html`` and PNG plots to ``--out`` and the
same tables and plots to W&B (offline by default). The measurements import torch, so they are
imported inside the functions that run them: ``draftkit --help`` stays fast.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from draftkit.config import option, reuse, to_dict
from draftkit.decode.args import SamplingArgs, SpeculationArgs
from draftkit.decode.k import AUTO, FixedK
from draftkit.engines.vllm import CPU_FIX_CHOICES, CPU_FIX_HELP, PYTHON_HELP
from draftkit.errors import ConfigError
from draftkit.evaluate.regimes.drafts import DEFAULT_DRAFT_LAYERS
from draftkit.evaluate.regimes.report import REGIMES, write_regimes_report
from draftkit.evaluate.report import (domain_table, format_text_table, headline, plain_step_text,
                                      write_report)
from draftkit.evaluate.settings import EvalSettings
from draftkit.evaluate.suite import builtin_suites_dir
from draftkit.figures import EvalReport, RegimesReport
from draftkit.models.args import ModelArgs
from draftkit.tracking import Tracker


ENGINE_GROUP = "engine options"


def suite_path(suite: str) -> Path:
    """``--suite``: a JSONL file or folder, or 'builtin', the shipped eval/suites."""
    return builtin_suites_dir() if suite == "builtin" else Path(suite)


# --- draftkit eval -------------------------------------------------------------------------------

@dataclass
class EvalArgs(ModelArgs, EvalSettings):
    """Measure a draft against its target on domain suites and write a report. Under --k auto,
    one K policy runs per domain, learning across its prompts as a server's does across
    requests; --k-max also bounds the K sweep's predictions."""

    suite: str = option("builtin", help="JSONL suite file or folder of them: draftkit's rows, "
                                        "or MT-Bench's, Spec-Bench's, HumanEval's or GSM8K's "
                                        "question files as published (their categories the "
                                        "domains); 'builtin' = the shipped eval/suites")
    out: str = option("runs/eval", help="output directory for the report")
    baseline_draft: str | None = option(None, help="a second draft (e.g. before distillation): "
                                                   "its teacher-forced alpha on the same "
                                                   "continuations is reported as alpha_before, "
                                                   "the draft's as alpha_after")
    limit: int | None = option(None, help="at most N prompts per domain")
    domains: list[str] | None = option(None, nargs="*", metavar="DOMAIN",
                                       help="only these domains (space- or comma-separated)")
    turns: str = option("first", choices=("first", "every"),
                        help="MT-Bench's and Spec-Bench's multi-turn questions: first: each "
                             "one's first turn; every: each later turn too, a prompt of its own "
                             "after the target's greedy answers to the turns before it")
    engine: str = option("draftkit", choices=("draftkit", "vllm"), group=ENGINE_GROUP,
                         help="draftkit: measure in draftkit's own engine (the usual report); "
                              "vllm: decode the bundle (--draft BUNDLE) in vLLM, in its own "
                              "environment, beside draftkit on the same prompts: acceptance per "
                              "position and tau in each, vLLM's speedup, greedy outputs "
                              "compared, and a control (the target drafting for itself); at "
                              "--k (auto: the bundle's K) and at the bundle's config as written, "
                              "at each of --temperatures; the sweeps are not run")
    engine_python: str | None = option(None, group=ENGINE_GROUP, help=PYTHON_HELP)
    vllm_cpu_fix: str = option("auto", choices=CPU_FIX_CHOICES, group=ENGINE_GROUP,
                               help=CPU_FIX_HELP)
    temperatures: list[float] | None = option(None, nargs="*", metavar="T", group=ENGINE_GROUP,
                                              help="the temperatures --engine vllm compares "
                                                   "(default: 0 and --temperature, or 1 where "
                                                   "that is 0)")

    def validate(self) -> None:
        super().validate()
        if self.engine != "vllm" and self.temperatures is not None:
            raise ConfigError("--temperatures is for --engine vllm; draftkit's own eval takes "
                              "one --temperature")
        if self.engine != "vllm" and self.vllm_cpu_fix != "auto":
            raise ConfigError("--vllm-cpu-fix is for --engine vllm")
        if any(t < 0 for t in self.temperatures or []):
            raise ConfigError("--temperatures must be >= 0")
        if self.k_max < 1:
            raise ConfigError("--k-max must be >= 1")
        if self.limit is not None and self.limit < 1:
            raise ConfigError("--limit must be >= 1")
        if self.engine == "vllm" and self.turns != "first":
            raise ConfigError("--turns every is for draftkit's own eval; --engine vllm "
                              "compares first turns")


def engine_temperatures(args: EvalArgs) -> list[float]:
    """What --engine vllm compares: --temperatures, else greedy and --temperature (or 1)."""
    return args.temperatures if args.temperatures else [0.0, args.temperature or 1.0]


def evaluate_in_engine(args: EvalArgs):
    """``draftkit eval --engine vllm``: the bundle in vLLM beside draftkit; writes the report."""
    from draftkit.evaluate.parity.measure import engine_parity
    from draftkit.evaluate.parity.report import (control_table, parity_table, verdicts,
                                                 write_parity_report)

    k = None if args.k == AUTO else args.k
    if k == 0:
        raise ConfigError("--engine vllm compares speculative decoding: --k must be >= 1 or "
                          "auto (the bundle's K)")
    report = engine_parity(args.draft, args.target, suite_path(args.suite), k=k,
                           temperatures=engine_temperatures(args),
                           max_new_tokens=args.max_new_tokens, seed=args.seed,
                           out_dir=Path(args.out), top_k=args.top_k, top_p=args.top_p,
                           limit=args.limit, domains=args.domains,
                           dtype=args.dtype, device=args.device,
                           engine_python=args.engine_python, cpu_fix=args.vllm_cpu_fix)
    files = write_parity_report(report, args.out)
    print(format_text_table(*parity_table(report)))
    print()
    print(format_text_table(*control_table(report)))
    for line in verdicts(report):
        print(f"- {line}")
    print(f"report: {files['md']} (also {files['html'].name}, {files['json'].name}); "
          f"{report.seconds / 60:.1f} min")
    return report


def run_eval(args: EvalArgs) -> EvalReport:
    """Measure and return the report (``evaluate`` also writes it)."""
    # the measurements import torch
    from draftkit.evaluate.run import eval_report

    settings = dataclasses.replace(args, k_sweep=[k for k in args.k_sweep if k <= args.k_max])
    return eval_report(args.target, args.draft, suite_path(args.suite), settings,
                       baseline_draft=args.baseline_draft, limit=args.limit,
                       domains=args.domains, device=args.device, dtype=args.dtype,
                       every_turn=args.turns == "every")


def evaluate(args: EvalArgs) -> EvalReport:
    """``draftkit eval``: measure, write the report and print the per-domain table."""
    if args.engine == "vllm":
        return evaluate_in_engine(args)
    with Tracker("eval", to_dict(args), out_dir=args.out) as tracker:
        report = run_eval(args)
        files = write_report(report, args.out, tracker)
    if report.benchmark:
        print(f"benchmark {report.benchmark}")
    print(format_text_table(*domain_table(report)))
    print(f"\n{headline(report)}")
    if report.plain_step is not None:
        print(plain_step_text(report))
    print(f"report: {files['md']} (also {files['html'].name}, {files['json'].name}, plots)")
    return report


# --- draftkit regimes ----------------------------------------------------------------------------

@dataclass
class RegimesArgs(ModelArgs, SpeculationArgs):
    """Measure where speculation stops paying for a target and draft on your own prompts: high
    entropy, a draft too slow for its acceptance, domain mismatch and large batches."""

    draft: str | None = reuse(ModelArgs, "draft", None, note="; the draft to map (default: an "
                              f"early exit of the target's first {DEFAULT_DRAFT_LAYERS} layers)")
    suite: str = option("builtin", help="JSONL suite file or folder of them; 'builtin' = the "
                                        "shipped eval/suites")
    domains: list[str] | None = option(None, nargs="*", metavar="DOMAIN",
                                       help="only these domains (space- or comma-separated)")
    out: str = option("runs/regimes", help="output directory for the report")
    drafts_by_domain: list[str] = option([], nargs="*", metavar="DOMAIN=PATH",
                                         help="drafts distilled on one domain each, for the "
                                              "mismatch matrix (default: every draft measured, "
                                              "on every domain)")
    layer_sizes: list[int] = option([1, 2, 4, 8, 15, 24, 30], nargs="*", metavar="N",
                                    help="depths of the early-exit drafts of the draft-cost "
                                         "regime; N >= the target's depth is the target itself")
    temperatures: list[float] = option([0.0, 0.7, 1.0, 1.3], nargs="*", metavar="T",
                                       help="sampling temperatures of the entropy regime")
    batch_sizes: list[int] = option([1, 2, 4, 8, 16], nargs="*", metavar="B",
                                    help="batch sizes of the batch regime (none to skip it)")
    prompts_per_domain: int = option(2, help="prompts per domain in the entropy, cost and "
                                             "mismatch regimes (the batch regime takes as many "
                                             "as --batch-groups of its largest batch)")
    batch_groups: int = reuse(EvalSettings, "batch_groups", 2,
                              note=" (here per domain; 2, the fewest that give an interval, "
                                   "to keep the map's budget)")
    max_new_tokens: int = option(32, help="new tokens per prompt")
    k: FixedK = reuse(SpeculationArgs, "k", 2, note="; regimes takes a fixed K >= 1, the same in "
                 "every measurement, so that slowdowns show instead of the policy hiding them "
                 "(the batch regime also reports the K that --k auto picks)")
    seed: int = reuse(SamplingArgs, "seed")

    def validate(self) -> None:
        super().validate()
        for name in ("prompts_per_domain", "batch_groups", "max_new_tokens", "k_max"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1")
        if any(n < 1 for n in self.layer_sizes) or any(b < 1 for b in self.batch_sizes):
            raise ConfigError("--layer-sizes and --batch-sizes take positive integers")
        if any(t < 0 for t in self.temperatures):
            raise ConfigError("--temperatures must be >= 0")
        for item in self.drafts_by_domain:
            domain, _, path = item.partition("=")
            if not domain.strip() or not path.strip():
                raise ConfigError(f"--drafts-by-domain takes DOMAIN=PATH, got {item!r}")


def domain_drafts(items: list[str] | None = None) -> dict[str, str]:
    """``["code=D1", "math=D2"]`` -> ``{"code": "D1", "math": "D2"}``."""
    return {d.strip(): p.strip() for d, _, p in (i.partition("=") for i in items or [])}


def run_regimes(args: RegimesArgs) -> RegimesReport:
    """Load, measure all four regimes and return the report (``regimes`` writes it)."""
    from draftkit.evaluate.regimes.run import regime_map  # the measurements import torch

    return regime_map(args.target, args.draft, suite_path(args.suite), k=args.k,
                      k_max=args.k_max, seed=args.seed, max_new_tokens=args.max_new_tokens,
                      temperatures=args.temperatures, layer_sizes=args.layer_sizes,
                      batch_sizes=args.batch_sizes, prompts_per_domain=args.prompts_per_domain,
                      batch_groups=args.batch_groups,
                      drafts_by_domain=domain_drafts(args.drafts_by_domain),
                      domains=args.domains, device=args.device, dtype=args.dtype)


def regimes(args: RegimesArgs) -> RegimesReport:
    """``draftkit regimes``: measure the four regimes, write the report, print the answers."""
    with Tracker("regimes", to_dict(args), out_dir=args.out) as tracker:
        report = run_regimes(args)
        files = write_regimes_report(report, args.out, tracker)
    print(report.headline)
    titles = dict(REGIMES)
    for key, section in report.regimes():
        print(f"{titles[key]}: {section.answer}")
    print(f"report: {files['md']} (also {files['html'].name}, {files['json'].name}, plots); "
          f"{report.seconds / 60:.1f} min")
    return report
