"""The evaluation commands, each the plain function the CLI calls with its args dataclass
(:mod:`draftkit.evaluate.args`).

``draftkit eval``: alpha, tau, c, predicted and measured speedup per domain::

    draftkit eval --target embedded --draft runs/quickstart/bundle --out runs/eval
    draftkit eval --target embedded --draft D --baseline-draft D0 --limit 10 --k 3

``draftkit regimes``: where speculation stops paying for this target, draft and traffic
(:mod:`draftkit.evaluate.regimes`)::

    draftkit regimes --out runs/regimes                     # embedded target, derived drafts
    draftkit regimes --target T --draft runs/quickstart/bundle --domains code math creative
    draftkit regimes --target T --draft D --drafts-by-domain code=D_code math=D_math

Each writes ``report.json``, ``report.md``, ``report.html`` and PNG plots to ``--out`` and the
same tables and plots to W&B (offline by default).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from draftkit.config import to_dict
from draftkit.decode.k import AUTO
from draftkit.errors import ConfigError
from draftkit.evaluate.args import EvalArgs, RegimesArgs
from draftkit.evaluate.parity.measure import engine_parity
from draftkit.evaluate.parity.report import (control_table, parity_table, verdicts,
                                             write_parity_report)
from draftkit.evaluate.regimes.report import REGIMES, write_regimes_report
from draftkit.evaluate.regimes.run import regime_map
from draftkit.evaluate.report import (domain_table, format_text_table, headline, plain_step_text,
                                      write_report)
from draftkit.evaluate.run import eval_report
from draftkit.evaluate.suite import builtin_suites_dir
from draftkit.figures import EvalReport, RegimesReport
from draftkit.tracking import Tracker


def suite_path(suite: str) -> Path:
    """``--suite``: a JSONL file or folder, or 'builtin', the shipped eval/suites."""
    return builtin_suites_dir() if suite == "builtin" else Path(suite)


# --- draftkit eval -------------------------------------------------------------------------------

def engine_temperatures(args: EvalArgs) -> list[float]:
    """What --engine vllm compares: --temperatures, else greedy and --temperature (or 1)."""
    return args.temperatures if args.temperatures else [0.0, args.temperature or 1.0]


def evaluate_in_engine(args: EvalArgs):
    """``draftkit eval --engine vllm``: the bundle in vLLM beside draftkit; writes the report."""
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

def domain_drafts(items: list[str] | None = None) -> dict[str, str]:
    """``["code=D1", "math=D2"]`` -> ``{"code": "D1", "math": "D2"}``."""
    return {d.strip(): p.strip() for d, _, p in (i.partition("=") for i in items or [])}


def run_regimes(args: RegimesArgs) -> RegimesReport:
    """Load, measure all four regimes and return the report (``regimes`` writes it)."""
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
