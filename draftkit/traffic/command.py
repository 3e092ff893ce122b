"""``draftkit traffic``: served acceptance per domain beside the bundle's eval, drift flagged.

    draftkit serve BUNDLE --record runs/traffic                  # keep what is served
    draftkit traffic runs/traffic --bundle BUNDLE                # the table
    draftkit traffic runs/traffic --bundle BUNDLE --out runs/traffic-report --min-requests 50
    draftkit traffic --prometheus http://prometheus:9090 --window 1h --bundle BUNDLE  # a fleet

The figures and the flag rule: :mod:`draftkit.traffic.drift`. With ``--bundle`` the traffic
must have been recorded with the bundle's target and tokenizer (their identities are checked).
The folder is read through :func:`~draftkit.traffic.shards.read_traffic`: bad shards,
duplicated and out-of-sequence records and records of another target are named and left out
(``--strict`` refuses them), shards written before seals are counted as unverified, all of it
said under the summary line. The table shows the ``--top`` largest domains by requests (and
every flagged one); the rest fold into one row (``--all``: a row per label).
Requests the engine reported no acceptance counts for (a request of n > 1, a vLLM server
started without per-request metrics, logs brought in with ``draftkit import-traffic``) are
replayed through the bundle's draft (:mod:`draftkit.traffic.replay`; ``--replay``);
``--out`` writes ``report.json``, ``report.md``, ``report.html`` and a plot of the served
alpha_i beside the eval's alpha. ``--prometheus`` adds the whole fleet's own vLLM counters
(:mod:`draftkit.traffic.fleet`), with or without a traffic folder.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

from tqdm.auto import tqdm
from transformers import AutoConfig

from draftkit.errors import Declined, DraftkitError, ModelError
from draftkit.evaluate.render import (fmt, html_image, html_page, html_table, markdown_table,
                                      save_png, write_files)
from draftkit.evaluate.report import format_text_table
from draftkit.figures import now
from draftkit.manifest import NAME as MANIFEST, Manifest, read_manifest
from draftkit.models import load_pair, load_tokenizer, resolve_model
from draftkit.models.facts import vocab_size
from draftkit.models.resolve import model_identity
from draftkit.traffic.args import ALL, OFF, TrafficArgs
from draftkit.traffic.drift import (DRIFT, DomainDrift, Estimate, TrafficReport, domain_drift,
                                    traffic_drift)
from draftkit.traffic.fleet import FleetFigures, fleet_figures, fleet_lines
from draftkit.traffic.record import Counts, TrafficRecord, engine_counts, tokenizer_identity
from draftkit.traffic.replay import Replayer
from draftkit.traffic.shards import read_traffic

PLOT = ("alpha_per_position.png", "Served alpha_i against the eval's alpha")


def traffic(args: TrafficArgs) -> TrafficReport | FleetFigures:
    """``draftkit traffic``: :func:`traffic_report`, and the answer "no" (Declined: exit status
    3) where it flags drift, so a script can act on it."""
    report = traffic_report(args)
    flagged = report.flagged() if isinstance(report, TrafficReport) else []
    if flagged:
        raise Declined(f"drift in {', '.join(flagged)}: served alpha below the eval's (the "
                       f"table above says by how much)")
    return report


def traffic_report(args: TrafficArgs) -> TrafficReport | FleetFigures:
    """Read the traffic, compare it with the bundle, print the table; with ``--prometheus``,
    the fleet's counters too (alone: -> them)."""
    manifest = target = tokenizer = draft = vocab = None
    if args.bundle:
        manifest, target, tokenizer, draft, vocab = bundle_identities(args.bundle)
    if args.prometheus:
        fleet = fleet_figures(args.prometheus, args.window, args.selector)
        print("\n".join(fleet_lines(fleet, manifest)))
        if args.folder is None:
            return fleet
        print()
    read = read_traffic(args.folder, target=target, tokenizer=tokenizer, vocab=vocab,
                        strict=args.strict)
    records = read.records
    if args.domain is not None:
        labels = sorted({r.domain for r in records})
        records = [r for r in records if r.domain == args.domain]
        if not records:
            raise DraftkitError(f"no request in {args.folder} is labelled {args.domain!r}; its "
                                f"labels: {', '.join(labels)}")
    counts = [None if args.replay == ALL else engine_counts(r) for r in records]
    if args.bundle and args.replay != OFF and any(
            x is None and r.prompt_ids is not None for r, x in zip(records, counts)):
        counts = replay_counts(records, counts, args.bundle, manifest, args.device)
    report = traffic_drift(records, manifest, counts, folder=str(args.folder),
                           bundle=args.bundle, draft=draft, min_requests=args.min_requests,
                           replay_k=replay_k(manifest) if manifest else None, created=now())
    report.integrity = read.integrity
    fold(report, records, counts, None if args.all else args.top)
    print(summary(report))
    for line in integrity_lines(report):
        print(line)
    print(format_text_table(*drift_table(report)))
    for line in conclusions(report):
        print(line)
    if args.out:
        plots, files = write_files(report, args.out, write_plot, render_markdown, render_html)
        print(f"report: {files['md']} (also {files['html'].name}, {files['json'].name}"
              f"{', the plot' if plots else ''})")
    return report


def replay_k(manifest: Manifest) -> int:
    """The K a replay drafts at: the one the bundle is served with."""
    serving = manifest.serving
    return serving.num_speculative_tokens if serving else max(manifest.num_speculative_tokens, 1)


def replay_counts(records: list[TrafficRecord], counts: list[Counts | None], bundle: str,
                  manifest: Manifest, device: str | None) -> list[Counts | None]:
    """``counts`` with each None replaced by a replay of its record through the bundle's
    draft at the bundle's K (:mod:`draftkit.traffic.replay`), with a progress bar; a record
    kept without its prompt cannot be replayed and stays None."""
    todo = [i for i, x in enumerate(counts) if x is None and records[i].prompt_ids is not None]
    if not (Path(bundle) / "draft" / "config.json").is_file():
        raise ModelError(f"{bundle} holds no draft to replay {len(todo)} requests through; "
                         f"pass --replay off, or the bundle that served them")
    pair = load_pair(bundle, bundle, device=device)
    replayer = Replayer(pair.target, pair.draft, replay_k(manifest))
    out = list(counts)
    for i in tqdm(todo, desc="replay", unit="request", dynamic_ncols=True):
        out[i] = replayer.counts(records[i])
    return out


def bundle_identities(bundle: str) -> tuple[Manifest, str, str, str | None, int]:
    """The bundle's manifest, the identities of its target, tokenizer and draft (None: no
    draft/ to fingerprint), as ``draftkit serve`` records them, and its target's vocabulary
    size (:func:`target_vocab`)."""
    manifest, target, tokenizer = bundle_target(bundle)
    draft = model_identity(resolve_model(bundle, "draft")) \
        if (Path(bundle) / "draft" / "config.json").is_file() else None
    return (manifest, model_identity(target), tokenizer_identity(tokenizer), draft,
            target_vocab(target, tokenizer))


def target_vocab(target, tokenizer) -> int:
    """How many token ids the target (resolved) knows: its config's vocabulary, at least its
    tokenizer's. A recorded id at or past it is no token of this target."""
    return max(vocab_size(AutoConfig.from_pretrained(target.path)) or 0, len(tokenizer))


def bundle_target(bundle: str):
    """(the bundle's manifest, its target resolved, the target's tokenizer); one line where
    ``bundle`` is not a bundle."""
    path = Path(bundle)
    if not (path / MANIFEST).is_file():
        raise ModelError(f"{bundle} is not a bundle (no {MANIFEST}); pass the folder "
                         f"`draftkit export` wrote, the one that served the traffic")
    manifest = read_manifest(path)
    target = resolve_model(str(path), "target")
    return manifest, target, load_tokenizer(target, "target")


# --- text ----------------------------------------------------------------------------------------

def _estimate(e: Estimate | None, pattern: str) -> str:
    """A figure and its 95% interval: ``0.612 (0.580-0.641)``, or "-"."""
    if e is None:
        return "-"
    return f"{pattern.format(e.value)} ({pattern.format(e.low)}-{pattern.format(e.high)})"


def fold(report: TrafficReport, records: list[TrafficRecord], counts: list[Counts | None],
         top: int | None) -> None:
    """Keep the ``top`` largest domains by requests (and every flagged one) as rows of the
    table; the rest become one row, ``report.other``, their requests together (None: a row
    per domain). ``report.domains`` keeps every one."""
    if top is None or len(report.domains) <= top:
        return
    shown = set(shown_domains(report)[:top]) | set(report.flagged())
    report.folded = [name for name in shown_domains(report) if name not in shown]
    folded = set(report.folded)
    rest = [(r, x) for r, x in zip(records, counts) if r.domain in folded]
    report.other = domain_drift([r for r, _ in rest], [x for _, x in rest], c=report.overall.c,
                                c_source=report.overall.c_source, compare=False)


def shown_domains(report: TrafficReport) -> list[str]:
    """The domains the table has a row for, largest (by requests) first."""
    folded = set(report.folded or ())
    return sorted((name for name in report.domains if name not in folded),
                  key=lambda name: (-report.domains[name].requests, name))


def drift_table(report: TrafficReport) -> tuple[list[str], list[list[str]]]:
    """Header and rows: each domain shown, largest first, the folded ones as one row, then
    all the traffic together (no status: the eval has no overall row in the manifest)."""
    header = ["domain", "requests", "acceptance from", "tokens", "alpha_1", "alpha (95%)",
              "eval alpha", "tau (95%)", "eval tau", "c", "speedup predicted (95%)", "status"]

    def row(name: str, d: DomainDrift) -> list[str]:
        e = d.eval
        c = fmt(d.c, "{:.3f}") + ("*" if d.c_source == "bundle" and name != "overall" else "")
        return [name, str(d.requests), ", ".join(f"{k} {n}" for k, n in d.counts.items()),
                str(d.completion_tokens),
                fmt(d.alpha_1.value if d.alpha_1 else None, "{:.3f}"),
                _estimate(d.alpha, "{:.3f}"), fmt(e.alpha if e else None, "{:.3f}"),
                _estimate(d.tau, "{:.2f}"), fmt(e.tau if e else None, "{:.2f}"), c,
                _estimate(d.speedup_predicted, "{:.2f}").replace(" (", "x ("),
                d.status or "-"]

    rows = [row(name, report.domains[name]) for name in shown_domains(report)]
    if report.other is not None:
        rows.append(row(f"other ({len(report.folded)} labels)", report.other))
    if len(report.domains) > 1:
        rows.append(row("overall", report.overall))
    return header, rows


def summary(report: TrafficReport) -> str:
    bundle = f"bundle {report.bundle}" if report.bundle else "no bundle"
    return (f"traffic {report.folder}: {report.requests} requests from {report.first} to "
            f"{report.last}, target {report.target}, {bundle}")


def integrity_lines(report: TrafficReport) -> list[str]:
    """What reading the folder verified and left out (:class:`Integrity`), under the summary."""
    return report.integrity.lines() if report.integrity is not None else []


def conclusions(report: TrafficReport) -> list[str]:
    """The lines under the table: the flags (or that there are none), the rule, the notes."""
    flagged = report.flagged()
    lines = [f"drift: {name}: {report.domains[name].why}" for name in flagged] or \
        ["no domain flagged" + ("" if report.bundle else " (nothing to compare: no bundle)")]
    lines.append(f"rule: {report.rule}")
    served = sorted({m for d in report.domains.values() for m in d.draft_sample_methods})
    if served:
        lines.append(f"drafts at temperature > 0: served {', '.join(served)} (greedy: the "
                     f"draft's argmax kept with probability p, vLLM's default "
                     f"draft_sample_method), the eval's "
                     f"{report.eval_draft_sample_method or 'not sampled'}")
    if any(d.c_source == "bundle" for d in report.domains.values()):
        lines.append("c*: the mean over the bundle's domains (its eval measured none for this "
                     "one)")
    lines.append("alpha_1: served only (the bundle keeps no eval alpha_1); predicted speedup: "
                 "the served alpha_i at the served K, v = 1")
    if report.folded:
        lines.append(f"other: {len(report.folded)} smaller labels in one row, none flagged "
                     f"(--all gives each a row; report.json keeps every one)")
    return lines + [f"note: {n}" for n in report.notes]


# --- files ---------------------------------------------------------------------------------------

def write_plot(report: TrafficReport, out_dir: Path) -> dict[str, Path]:
    """Served alpha_i per domain, and each domain's eval alpha as a dashed line of its colour;
    no plot where nothing was drafted."""
    drafted = {n: report.domains[n] for n in shown_domains(report)
               if report.domains[n].alpha_per_position}
    if not drafted:
        return {}
    import matplotlib  # local: a report that draws pays for it, Agg set first

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for i, (name, d) in enumerate(drafted.items()):
        color = f"C{i % 10}"
        positions = range(1, len(d.alpha_per_position) + 1)
        served = [a if t else math.nan  # a position no round reached has no rate
                  for a, t in zip(d.alpha_per_position, d.tested_per_position)]
        ax.plot(positions, served, "o-", color=color, label=f"{name} served")
        if d.eval is not None and d.eval.alpha is not None:
            ax.axhline(d.eval.alpha, color=color, ls="--", alpha=0.7,
                       label=f"{name} eval alpha")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("draft position i")
    ax.set_ylabel("conditional alpha_i")
    ax.set_ylim(0, 1)
    ax.set_title("served alpha_i (points); the eval's alpha over all positions (dashed)",
                 fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    return {PLOT[1]: save_png(fig, out_dir / PLOT[0])}


def render_markdown(report: TrafficReport, plots: dict[str, Path]) -> str:
    lines = ["# Served traffic against the bundle's eval", "", summary(report), ""]
    lines += [f"- {line.strip()}" for line in integrity_lines(report)] + [""]
    lines += markdown_table(*drift_table(report))
    lines += [""] + [f"- {line}" for line in conclusions(report)]
    lines += [f"- {name}: {d.status}: {d.why}" for name, d in
              ((n, report.domains[n]) for n in shown_domains(report))
              if d.status and d.status != DRIFT]
    for title, path in plots.items():
        lines += ["", f"## {title}", "", f"![{title}]({path.name})"]
    return "\n".join(lines) + "\n"


def render_html(report: TrafficReport, plots: dict[str, Path]) -> str:
    body = [f"<p>{html.escape(summary(report))}</p>", "<ul>"]
    body += [f"<li>{html.escape(line.strip())}</li>" for line in integrity_lines(report)]
    body += ["</ul>", html_table(*drift_table(report)), "<ul>"]
    body += [f"<li>{html.escape(line)}</li>" for line in conclusions(report)] + ["</ul>"]
    body += [f"<h2>{title}</h2>{html_image(title, path)}" for title, path in plots.items()]
    return html_page("Served traffic against the bundle's eval", body)
