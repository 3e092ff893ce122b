"""The draft's model card, ``draft/README.md``: what a person (or the Hugging Face Hub) reads
about a published draft: the target it drafts for, the data it was trained on, the K it was
exported with, the eval's figures per domain with their intervals, how the bundle was checked,
and how to serve it.
"""

from __future__ import annotations

from typing import Any

from draftkit.figures import EvalReport


def model_card(*, name: str, kind: str, target: str, target_sha256: str | None, k: int,
               k_source: str, recipe: dict | None, report: EvalReport | None,
               signed: bool) -> str:
    """The card's Markdown, with the Hub's front matter (base model, tags)."""
    what = "an EAGLE-3 head (arXiv 2503.01840)" if kind == "eagle3" else "a draft model"
    serve = ("`vllm serve BUNDLE/draft` serves the target with this head (its config.json "
             "names both), or `bash BUNDLE/serving/vllm.sh`" if kind == "eagle3" else
             "`bash BUNDLE/serving/vllm.sh` (vLLM's draft_model method)")
    lines = ["---", f"base_model: {target}", "tags:", "- speculative-decoding",
             f"- {kind}", "- draftkit", "---", "",
             f"# {name}", "",
             f"{what[0].upper()}{what[1:]} for speculative decoding with **{target}**: it proposes "
             f"tokens, the target verifies them, and the output is the target's.", "",
             f"- **Target:** {target}" + (f" (content sha256 {target_sha256[:16]}...)"
                                         if target_sha256 else ""),
             f"- **Trained on:** {_data(recipe)}",
             f"- **K (num_speculative_tokens):** {k} ({_K_SOURCES.get(k_source, k_source)})",
             f"- **Serve:** {serve}", ""]
    lines += _figures(report)
    lines += ["## How it was checked", "",
              "Export reloaded the written draft and compared its logits with the trained "
              "one's, and checked its config against what vLLM and SGLang read. The bundle "
              "records the sha256 of every file and of its manifest"
              + (", and is signed (`draftkit.sig`); `draftkit check BUNDLE --trusted-key PUB` "
                 "verifies all of it" if signed else "; it is unsigned (exported with "
                 "--unsigned): `draftkit check BUNDLE` verifies the hashes")
              + ", and the serving scripts run the same checks before they launch.", ""]
    return "\n".join(lines)


_K_SOURCES = {"flag": "given at export", "report": "the K the eval's decodes used most",
              "default": "the default: no eval report said one"}


def _data(recipe: dict | None) -> str:
    sources = ((recipe or {}).get("data") or {}).get("sources") or []
    if not sources:
        return "not recorded (exported without its recipe)"
    return "; ".join(f"{s.get('path')}" + (f" ({s['domain']})" if s.get("domain") else "")
                     for s in sources if isinstance(s, dict))


def _figures(report: EvalReport | None) -> list[str]:
    if report is None:
        return ["## Measured", "", "Not measured: exported without an eval report.", ""]
    head = ("## Measured", "",
            f"`draftkit eval` on {report.device} in {report.dtype} at temperature "
            f"{_f(report.temperature, 1)}, {report.created}; the speedup is measured against plain "
            f"decoding, with its 95% interval (a paired bootstrap over prompts).", "",
            "| domain | prompts | alpha | tau | speedup | 95% interval | verdict |",
            "|---|---|---|---|---|---|---|")
    rows = [f"| {name} | {d.n_prompts} | {_f(d.alpha)} | {_f(d.tau, 2)} | "
            f"{_f(d.speedup_measured, 2, 'x')} | {_interval(d)} | {d.verdict or '-'} |"
            for name, d in sorted(report.domains.items())]
    return [*head, *rows, ""]


def _interval(d: Any) -> str:
    if d.speedup_low is None or d.speedup_high is None:
        return "-"
    return f"{d.speedup_low:.2f}-{d.speedup_high:.2f}x"


def _f(x: float | None, digits: int = 3, unit: str = "") -> str:
    return "-" if x is None else f"{x:.{digits}f}{unit}"
