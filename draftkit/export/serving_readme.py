"""A bundle's ``serving/README.md``: how to start each engine, and which of the figures draftkit
measured hold on which engine.

draftkit measures alpha, tau and K with speculative sampling as arXiv 2211.17192 has it: the
draft's token is drawn from its own distribution q and kept with probability min(1, p / q). An
engine that drafts the argmax and treats q as one-hot (vLLM's default ``draft_sample_method``
greedy, ``vllm/config/speculative.py``), or keeps a draft token with the target's probability
of it alone (SGLang's target-only verification, ``srt/speculative/`` with its accept
thresholds at 1.0, unless ``--speculative-use-rejection-sampling``, which its EAGLE workers
alone take), is still exact, but accepts less than alpha at temperature > 0. At temperature 0
every engine keeps the draft's token where it is the target's argmax, so greedy figures hold on
all of them. A bundle measured with block verification (arXiv 2403.10444) keeps more of its
sampled drafts than an engine that verifies token by token will.
"""

from __future__ import annotations

from draftkit.engines.releases import FEATURES
from draftkit.manifest import DomainEntry, ServingEntry


def _temperature(entry: ServingEntry) -> str:
    t = entry.measured_temperature
    return "not measured (no eval report)" if t is None else f"{t:g}"


def sampling_rows(entry: ServingEntry, kind: str,
                  figures: dict[str, DomainEntry] | None = None) -> list[tuple[str, str]]:
    """(engine and setting, what holds there) for the measured temperature and draft rule;
    ``figures``: the manifest's domains, whose teacher-forced acceptance with greedy drafts
    says how far a vLLM that drafts greedily falls from the measured figures."""
    t = entry.measured_temperature
    greedy = t is not None and t == 0
    same = "alpha, tau and K hold as measured"
    lower = ("at temperature > 0 acceptance is below the measured alpha (and tau with it): "
             "re-measure on this engine before trusting a speedup (figures measured at "
             "temperature 0 would hold)")
    if greedy:
        lower = same + " (measured greedily: every engine keeps the target's argmax)"
    dsm = FEATURES["vllm"]["draft_sample_method"]
    if entry.measured_draft_sample_method == "greedy":  # measured as vLLM drafts by default
        rows = [(f"vLLM >= {dsm} (the scripts write draft_sample_method greedy, as measured)",
                 same), (f"vLLM older than {dsm} (drafts greedily, q one-hot)", same)]
    else:
        rows = [(f"vLLM >= {dsm} (the scripts write draft_sample_method probabilistic)", same),
                (f"vLLM older than {dsm} (drafts greedily, q one-hot)",
                 lower if greedy else greedy_drafts_cell(figures or {}, lower))]
    if entry.measured_verify == "block":  # rows about drafts hold for the kept share, these
        block = FEATURES["vllm"]["rejection_sample_method"]
        rows += [(f"vLLM >= {block} on its Model Runner V2 (the scripts write "
                  f"rejection_sample_method block, as measured)", same),
                 (f"vLLM older than {block}, its CPU build, a parallel head, its V1 model "
                  f"runner (token verification; vllm.sh says so)", "at temperature > 0 fewer "
                  "drafted tokens are kept than measured with block verification (tau "
                  "below it); `draftkit eval --verify token` measures it as served")]
    for build, first, last, what in entry.engines.vllm.sampled_broken or []:
        rows.append((f"vllm-{build} {first} to {last} (vllm.sh warns)",
                     f"greedy figures hold; sampled requests gain nothing, as its verification "
                     f"of them is broken ({what}): there speculation only costs time. "
                     f"`draftkit eval --engine vllm` measures a bundle in the vLLM you have, "
                     f"with a control"))
    sglang = not entry.engines.sglang.refused  # a refused engine holds no figure: no row
    if sglang and kind == "eagle3":
        rs = FEATURES["sglang"]["speculative_use_rejection_sampling"]
        rows += [(f"SGLang >= {rs} (the script adds --speculative-use-rejection-sampling)", same),
                 (f"SGLang older than {rs} (target-only verification)", lower)]
    elif sglang:
        rows.append(("SGLang STANDALONE (target-only verification; it takes no rejection "
                     "sampling for a standalone draft)", lower))
    rows.append(("HF transformers assisted generation" if kind == "standalone" else
                 "draftkit generate / serve", "alpha, tau and K hold as measured (HF: greedy "
                 "in the snippet)" if kind == "standalone" else "alpha, tau and K hold as "
                 "measured: the same engine"))
    return rows


def greedy_drafts_cell(figures: dict[str, DomainEntry], otherwise: str) -> str:
    """What a vLLM that drafts greedily keeps, as the eval measured it teacher-forced on its
    own continuations (the draft's argmax kept with probability p, against its tokens sampled
    as the eval's were), per domain; ``otherwise`` where the eval measured none."""
    pairs = {d: (f.alpha_greedy_drafts, f.alpha_after) for d, f in figures.items()
             if f.alpha_greedy_drafts is not None and f.alpha_after}
    if not pairs:
        return otherwise
    ratio = sum(g for g, _ in pairs.values()) / sum(a for _, a in pairs.values())
    each = ", ".join(f"{d} {g:.3f} against {a:.3f}" for d, (g, a) in pairs.items())
    return (f"acceptance at temperature > 0 differs from the measured alpha: teacher-forced on "
            f"the eval's continuations the draft is kept at {ratio:.2f}x the rate it is with "
            f"sampled drafts ({each}), so expect served alpha near {ratio:.2f}x the measured "
            f"one; `draftkit eval --draft-sample-method greedy` measures it as served")


def readme(entry: ServingEntry, kind: str, k: int, figures: dict[str, DomainEntry]) -> str:
    """The README's text for the ``serving`` ``entry`` of a bundle whose draft is of ``kind``,
    recommended K ``k`` and measured ``figures`` (the manifest's ``domains``)."""
    vllm, sglang = entry.engines.vllm, entry.engines.sglang
    out = ["# Serving this bundle", "",
           "| engine | command | needs |", "|---|---|---|",
           f"| vLLM | `bash serving/vllm.sh [--target PATH] [flags]` | {_needs('vllm', vllm)} |",
           f"| SGLang | `bash serving/sglang.sh [--target PATH] [flags]` | "
           f"{_needs('sglang', sglang)} |",
           "| HF transformers | `python serving/hf_transformers.py [--target PATH] [--device D] "
           "[--dtype T]` | " + ("transformers" if kind == "standalone" else
                                "draftkit (HF cannot run an EAGLE-3 head)") + " |", ""]
    if vllm.parallel_drafting:
        out += ["The draft is a parallel EAGLE-3 head (P-EAGLE, arXiv 2602.01469): it drafts "
                "all K tokens in one forward, its positions 2..K reading the learned placeholder "
                "`mask_hidden` and the token `ptd_token_id` (draft/config.json). vLLM does so "
                "with `parallel_drafting: true` in its speculative config (vllm.sh and "
                f"vllm.json set it; from vLLM {vllm.min_version}).", ""]
    for name, e in (("vLLM", vllm), ("SGLang", sglang)):
        if e.refused:
            out += [f"**{name} will not serve this draft**: {e.refused}; its script says so "
                    f"and stops.", ""]
    out += [f"`--target` defaults to `{entry.target}` (where the target was at export); a "
            "target given is checked against the content hash `draftkit.json` records. The "
            f"draft is stored in {entry.dtype} and the scripts serve the target in it "
            "(`--dtype`, unless you pass your own). It shards at tensor-parallel sizes "
            f"{entry.tp_sizes}: SGLang runs the draft at the target's size and refuses "
            "another; vLLM runs it at `draft_tensor_parallel_size` 1 instead where it "
            "can.", ""]
    if k < 1:
        out += ["The evaluation recommends K = 0: speculation did not pay for this draft on "
                "the measured traffic, and serving the target alone is faster. The scripts "
                "use K = 1 so the draft can still be tried.", ""]
    out += ["## Which measured figures hold where", "",
            f"Measured at temperature {_temperature(entry)}"
            + (f" with {entry.measured_draft_sample_method} drafts"
               if entry.measured_draft_sample_method else "")
            + (", block verification" if entry.measured_verify == "block" else "") + ", K "
            f"{entry.num_speculative_tokens}"
            + (", per domain: " + ", ".join(
                f"{d} alpha {_fmt(r.alpha)} tau {_fmt(r.tau)}"
                for d, r in figures.items()) if figures else "") + ".", "",
            "| engine | what holds |", "|---|---|"]
    out += [f"| {engine} | {holds} |" for engine, holds in sampling_rows(entry, kind, figures)]
    out += [""]
    table = entry.k_per_batch_size
    out += ["## K per batch size", ""]
    if table:
        out += ["From the eval report's batch sweep (K = 0 where speculation did not pay); "
                "vLLM takes it as `num_speculative_tokens_per_batch_size` from "
                f"{FEATURES['vllm']['num_speculative_tokens_per_batch_size']} (vllm.sh adds "
                "it there; a batch size past the last range keeps its K), SGLang runs one K "
                "throughout.", "", "| batch sizes | K |", "|---|---|"]
        out += [f"| {a}-{b} | {k_} |" for a, b, k_ in table]
    else:
        out += ["No batch sweep was measured: every engine runs K "
                f"{entry.num_speculative_tokens} at every batch size."]
    return "\n".join(out) + "\n"


def _needs(engine: str, e) -> str:
    """The README table's cell for ``engine``'s entry ``e``: the release it needs, or that it
    will not serve the draft at all (said below the table)."""
    return "will not serve this draft (below)" if e.refused else \
        f"{engine} >= {e.min_version} ({e.why})"


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.2f}"
