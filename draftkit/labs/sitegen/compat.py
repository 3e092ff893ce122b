"""The compatibility table: which engine release serves which kind of draft, what works there,
and what was measured.

What works is :mod:`draftkit.engines.releases`' (the first release per engine and draft kind,
the settings later releases add, the builds known broken, what SGLang is refused), the same
tables export checks a bundle against; what was measured is every engine comparison
(``draftkit eval --engine vllm``) whose ``report.json`` is committed under
``eval/results/reports``.
"""

from __future__ import annotations

import json
from pathlib import Path

import draftkit
from draftkit.engines import releases
from draftkit.engines.releases import refused_engines
from draftkit.evaluate.parity.figures import ParityReport
from draftkit.evaluate.parity.report import verdicts
from draftkit.labs.sitegen.reference import cell, code, generated, prose, table
from draftkit.models.eagle3 import ARCHITECTURE

ENGINES = {"vllm": "vLLM", "sglang": "SGLang"}
KINDS = {  # the draft kinds releases.MIN_VERSIONS names, in words
    "standalone": "standalone draft",
    "eagle3": "EAGLE-3 head",
    "parallel": "parallel EAGLE-3 head (P-EAGLE)",
    "deep": "EAGLE-3 head of more than one layer",
}


def comparisons(root: Path) -> list[tuple[Path, object]]:
    """(report.json, its ParityReport) for each engine comparison under ``root``'s
    eval/results/reports, oldest first."""
    found = []
    for path in sorted((root / "eval" / "results" / "reports").glob("*/*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and {"engine", "engine_version", "rows"} <= data.keys():
            found.append((path, ParityReport.from_dict(data)))
    return found


def _refused(kind: str) -> dict[str, str]:
    """Engine -> why it is refused a draft of ``kind``, as export says it."""
    config = {"parallel": {"parallel_drafting": True},
              "deep": {"architectures": [ARCHITECTURE], "num_hidden_layers": 2}}.get(kind)
    return refused_engines(config) if config else {}


def page(root: Path) -> str:
    """The compatibility page, its links relative to the docs tree's top (``root``'s layout)."""
    measured = comparisons(root)
    link = {path: path.relative_to(root).with_name("report.md").as_posix()
            for path, _ in measured}

    def seen(engine: str, kind: str) -> str:
        runs = [(p, r) for p, r in measured
                if r.engine.split()[0].split("-")[0] == engine and r.draft_kind == kind]
        return "; ".join(f"{cell(r.engine)} ([{r.created[:10]}]({link[p]})): "
                         f"{verdicts(r)[-1].split(' (')[0]}, sampled verification "
                         f"{r.sampled_path}" for p, r in runs) or "not measured"

    rows = [["draftkit (its own engine)", ", ".join(KINDS.values()), draftkit.__version__,
             "every kind; the reference every engine's figures are compared with",
             "every row of [the results](eval/results/README.md)"]]
    for engine, name in ENGINES.items():
        for kind, words in KINDS.items():
            if (engine, kind) in releases.MIN_VERSIONS:
                release, why = releases.MIN_VERSIONS[(engine, kind)]
                rows.append([name, words, f">= {release}", cell(why), seen(engine, kind)])
            elif engine in _refused(kind):
                rows.append([name, words, "refused", cell(_refused(kind)[engine]), "-"])
    features = [[ENGINES[engine], code(key), release]
                for engine, keys in releases.FEATURES.items() for key, release in keys.items()]
    broken = [[f"{ENGINES['vllm']} ({build} build)", f"{first} to {last}", cell(what)]
              for build, first, last, what in releases.BROKEN_SAMPLED_VERIFY]
    runs = [[r.created[:10], cell(r.engine), KINDS.get(r.draft_kind, r.draft_kind), r.dtype,
             cell(r.target), "<br>".join(cell(v) for v in verdicts(r)), f"[report]({link[p]})"]
            for p, r in measured]
    return "\n".join([
        "# Compatibility", "",
        generated("`draftkit/engines/releases.py` (what each release serves, as export checks "
                  "it) and the engine comparisons committed in `eval/results/reports`"),
        "Which serving engine releases serve which kind of draft as draftkit exports it. "
        "`draftkit export` checks a bundle against these tables and records them in its "
        "manifest (`serving.engines`, [bundle manifest](reference/manifest.md)); the bundle's "
        "scripts check the installed release again before they launch.", "",
        *table(["engine", "draft kind", "release", "what works", "what was measured"], rows),
        "## Settings a later release adds", "",
        "The bundle's scripts add each only where the installed release reads it.", "",
        *table(["engine", "setting", "first release"], features),
        "## Known faults", "",
        "Builds whose sampled verification rejects every drafted token: the output is still "
        "the target's, but speculation only costs time there (greedy decoding is unaffected). "
        "`draftkit eval --engine vllm` runs a control, the target drafting for itself, that "
        "tells such a build from a weak draft.", "",
        *table(["engine", "releases", "what goes wrong"], broken),
        "## What was measured", "",
        "Every engine comparison committed (`draftkit eval --engine vllm`): the bundle decoded "
        "in the engine and in draftkit on the same prompts. The other engine measurements (vLLM "
        "behind draftkit's front, the traffic loop through vLLM, draftkit's correction of the "
        "CPU build's sampled verification) are rows of [the results](eval/results/README.md).",
        "",
        *table(["date", "engine", "draft kind", "dtype", "target", "findings", "report"], runs),
        "## Where the releases come from", "", prose(releases), ""])
