"""Several drafts of one target, measured side by side in one run, per domain.

Each draft's speedup over plain decoding and over the first draft, each with a 95% interval,
tau, alpha at positions 1-4, c (a draft forward over a target step) and the draft's time per
speculative round in target steps (K c for a draft that takes a forward a token; c for a
parallel head, which drafts the round in one forward), and the K it used.

Each prompt is decoded plainly and with every draft, in an order that rotates from prompt to
prompt, so the machine's drifts fall on all of them alike; each draft keeps one K policy per
domain (``--k auto``), learning across its prompts as ``draftkit eval`` does. A draft's speedup
interval is a paired bootstrap over prompts against the plain decodes of the same prompts. This
is how the EAGLE-3 head of ``recipes/smollm2-135m-instruct_to_eagle3/ttt_cpu.yaml`` is held
against the 4-layer standalone draft of ``fkl_topk_cpu_more_prompts.yaml``, same prompts, same
machine state (2 CPU cores)::

    OMP_NUM_THREADS=2 python eval/benchmarks/reproduce/drafts_side_by_side.py \\
        --draft standalone=runs/smollm2-135m-4layer-fkl-more-prompts/best \\
        --draft eagle3=runs/smollm2-135m-eagle3-ttt/best --domains code,math --out runs/side

A draft may also name its own dtype and verification rule, ``NAME=PATH,dtype=bfloat16,
verify=block``, so one run holds one head as it decodes today and with each change (its speedup
is over plain decoding in its own dtype, which the run decodes too, in the same rotation)::

    OMP_NUM_THREADS=2 python eval/benchmarks/reproduce/drafts_side_by_side.py --temperature 1 \\
        --draft today=runs/head/best,dtype=float32 --draft block=runs/head/best,verify=block \\
        --draft bf16=runs/head/best,dtype=bfloat16 --domains code,math --out runs/side-t1

It prints the table and writes ``side_by_side.json``, ``side_by_side.md`` and
``speedup.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

POSITIONS = 4  # alpha_1..alpha_4 in the table


def main(argv: list[str] | None = None) -> int:
    from draftkit.decode.sampling_params import VERIFY_RULES
    from draftkit.models.load import DTYPES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="embedded", help="the target the drafts draft for")
    ap.add_argument("--draft", action="append", required=True,
                    metavar="NAME=PATH[,dtype=D][,verify=token|block]",
                    help="a draft to measure, repeatable; the first is the others' reference; "
                         "dtype and verify default to --dtype and --verify")
    ap.add_argument("--suite", default="builtin", help="the prompt suite draftkit eval reads")
    ap.add_argument("--domains", default="code,math", help="comma-separated domains of the suite")
    ap.add_argument("--limit", type=int, default=None, help="at most N prompts per domain")
    ap.add_argument("--k", default="auto", help="drafted tokens a round, or auto")
    ap.add_argument("--k-max", type=int, default=8, help="the longest K --k auto tries")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 decodes greedily")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="tokens decoded a prompt")
    ap.add_argument("--device", default=None, help="cpu, cuda, ...; default: cuda if present")
    ap.add_argument("--dtype", default="auto", choices=DTYPES,
                    help="the models' dtype; auto: bf16 on GPU, fp32 on CPU")
    ap.add_argument("--verify", default="token", choices=VERIFY_RULES,
                    help="how sampled drafts are verified, where a draft names no rule")
    ap.add_argument("--out", default="runs/side-by-side", help="folder for the table and plot")
    args = ap.parse_args(argv)
    try:
        drafts = dict(variant(d, args, DTYPES, VERIFY_RULES) for d in args.draft)
    except ValueError as e:
        ap.error(f"--draft {e}")
    if len(drafts) != len(args.draft):
        ap.error("--draft takes NAME=PATH[,dtype=D][,verify=R], each NAME once")

    rows = measure(args, drafts)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "side_by_side.json").write_text(json.dumps(rows, indent=2) + "\n")
    table = markdown(rows, args)
    (out / "side_by_side.md").write_text(table + "\n")
    plot(rows, out / "speedup.png")
    print(table)
    print(f"wrote {out}/side_by_side.json, side_by_side.md, speedup.png")
    return 0


def variant(spec: str, args, dtypes, rules) -> tuple[str, dict]:
    """``NAME=PATH[,dtype=D][,verify=R]`` -> (NAME, {path, dtype, verify})."""
    name, _, rest = spec.partition("=")
    path, *options = rest.split(",")
    out = {"path": path, "dtype": args.dtype, "verify": args.verify}
    for option in options:
        key, _, value = option.partition("=")
        if key not in ("dtype", "verify") or value not in (dtypes if key == "dtype" else rules):
            raise ValueError(f"{spec}: {option!r} is not dtype=one of {', '.join(dtypes)} or "
                             f"verify=one of {', '.join(rules)}")
        out[key] = value
    if not name or not path:
        raise ValueError(f"{spec}: give NAME=PATH")
    return name, out


def measure(args, drafts: dict[str, dict]) -> list[dict]:
    from tqdm.auto import tqdm

    from draftkit.chat import encode_prompt
    from draftkit.decode.choice import PLAIN
    from draftkit.decode.stats import DecodeStats
    from draftkit.evaluate.command import suite_path
    from draftkit.evaluate.measure import Evaluator
    from draftkit.evaluate.settings import EvalSettings
    from draftkit.evaluate.suite import by_domain, load_suite
    from draftkit.models import dtype_name, load_another_draft, load_pair

    names = list(drafts)
    pairs_by_dtype = {}  # a target per dtype the drafts name, loaded once
    for d in dict.fromkeys(v["dtype"] for v in drafts.values()):
        pairs_by_dtype[d] = load_pair(args.target, None, device=args.device, dtype=d)
    pair = pairs_by_dtype[drafts[names[0]]["dtype"]]
    evaluators, dtype_of = {}, {}
    for n, v in drafts.items():
        target = pairs_by_dtype[v["dtype"]]
        draft = load_another_draft(target, v["path"], device=args.device, dtype=v["dtype"])
        settings = EvalSettings(k=args.k, k_max=args.k_max, temperature=args.temperature,
                                max_new_tokens=args.max_new_tokens, verify=v["verify"])
        settings.validate()  # K checked here, once; the evaluators trust it
        evaluators[n] = Evaluator(target.target, draft, settings)
        dtype_of[n] = dtype_name(target.target)  # what the draft's dtype resolved to
    # plain decoding in each dtype the drafts run in: each speedup is over its own dtype's
    plain_of = {n: f"plain {d}" for n, d in dtype_of.items()}
    for n, mode in plain_of.items():
        evaluators.setdefault(mode, evaluators[n])
    suite = load_suite(suite_path(args.suite), limit=args.limit,
                       domains=[d for d in args.domains.split(",") if d])
    prompts = {d: [encode_prompt(pair.tokenizer, r.prompt) for r in g]
               for d, g in by_domain(suite).items()}
    for n in names:
        evaluators[n].warm_up(next(iter(prompts.values()))[:1], settings.k)
    modes = [*dict.fromkeys(plain_of.values()), *names]
    results = []
    total = sum(len(p) for p in prompts.values()) * len(modes)
    with tqdm(total=total, desc="side by side", unit="decode") as bar:
        for domain, ids in prompts.items():
            stats = {m: DecodeStats() for m in modes}
            # --k auto: one policy per draft for the domain's prompts
            choices = {**{m: PLAIN for m in plain_of.values()},
                       **{n: evaluators[n].choice(settings.k) for n in names}}
            pairs: dict[str, list] = {n: [] for n in names}
            for i, prompt in enumerate(ids):
                turn = modes[i % len(modes):] + modes[:i % len(modes)]  # rotate the order
                timed = {}
                for mode in turn:
                    (res,), secs = evaluators[mode].decode([prompt], choices[mode],
                                                           args.max_new_tokens, stats[mode],
                                                           settings.seed + i)
                    timed[mode] = (secs, len(res.tokens))
                    bar.update(1)
                for n in names:
                    plain = timed[plain_of[n]]
                    pairs[n].append((plain[0], timed[n][0], plain[1], timed[n][1]))
            for n in names:
                step = stats[plain_of[n]].target_step_seconds(1)
                results.append(figures(domain, n, stats[n], step, pairs[n]))
    for n in names:  # every domain's prompts together
        rows = [r for r in results if r["draft"] == n]
        results.append(overall(n, rows))
    for r in results:  # what each dtype resolved to (auto: by device), and the rule
        r["dtype"] = dtype_of[r["draft"]]
        r["verify"] = drafts[r["draft"]]["verify"]
    return against_first(results, names[0])


def against_first(rows: list[dict], first: str) -> list[dict]:
    """Each later draft's speedup over the first draft (``vs_first``), paired prompt by prompt
    as against plain decoding: both decoded every prompt in the same rotation, so the interval
    says whether one draft is ahead, which two overlapping intervals over plain cannot."""
    from draftkit import metrics

    base = {r["domain"]: r for r in rows if r["draft"] == first}
    for r in rows:
        b = base[r["domain"]]
        if r["draft"] == first or len(r["pairs"]) < 2:
            r["vs_first"] = None
            continue
        est, low, high = metrics.speedup_interval([p[1] for p in b["pairs"]],
                                                  [p[1] for p in r["pairs"]],
                                                  [p[3] for p in b["pairs"]],
                                                  [p[3] for p in r["pairs"]])
        r["vs_first"] = {"draft": first, "speedup": est, "low": low, "high": high}
    return rows


def figures(domain: str, name: str, stats, plain_step: float | None, pairs: list) -> dict:
    from draftkit import metrics

    est, low, high = metrics.speedup_interval(*zip(*pairs))
    if len(pairs) < 2:  # one prompt: no interval, as in draftkit eval
        low = high = None
    alphas = stats.alphas()
    # the draft's forwards per speculative round, in target steps: what drafting costs a round
    spec_rounds = sum(n for k, n in stats.rounds_by_k().items() if k)
    c_round = (stats.seconds_draft / spec_rounds / plain_step
               if spec_rounds and plain_step else None)
    return {"domain": domain, "draft": name, "prompts": len(pairs), "speedup": est,
            "speedup_low": low, "speedup_high": high, "tau": stats.tau(),
            "alpha": stats.alpha() if stats.accepted + stats.rejections else None,
            "alpha_per_position": alphas[:POSITIONS], "c": stats.c(plain_step),
            "c_round": c_round, "draft_per_round": stats.draft_per_round,
            "k_used": stats.k_used(),
            "rounds_by_k": {str(k): n for k, n in sorted(stats.rounds_by_k().items())},
            "pairs": pairs}


def overall(name: str, rows: list[dict]) -> dict:
    from draftkit import metrics

    pairs = [p for r in rows for p in r["pairs"]]
    est, low, high = metrics.speedup_interval(*zip(*pairs))
    weight = sum(r["prompts"] for r in rows)
    def mean(key):
        return sum(r[key] * r["prompts"] for r in rows if r[key] is not None) / weight

    return {"domain": "overall", "draft": name, "prompts": weight, "speedup": est,
            "speedup_low": low, "speedup_high": high, "tau": mean("tau"), "alpha": mean("alpha"),
            "alpha_per_position": [], "c": mean("c"), "c_round": mean("c_round"),
            "draft_per_round": rows[0]["draft_per_round"], "k_used": None, "rounds_by_k": {},
            "pairs": pairs}


def markdown(rows: list[dict], args) -> str:
    def f(x, pattern="{:.3f}"):
        return "-" if x is None else pattern.format(x)

    lines = [f"target {args.target}, --k {args.k}, temperature {args.temperature}, "
             f"{args.max_new_tokens} new tokens a prompt; speedup over plain decoding of the same "
             f"prompts in the draft's dtype, 95% interval a paired bootstrap over prompts; c: a "
             f"draft forward over a target step; draft per round: the draft's time a speculative "
             f"round, in target steps", "",
             "| domain | draft | prompts | speedup | 95% interval | over the first draft | tau | "
             "alpha | " + " | ".join(f"alpha_{i}" for i in range(1, POSITIONS + 1))
             + " | c | draft per round | K used | dtype | verify |",
             "|" + "---|" * (13 + POSITIONS)]
    for r in rows:
        pos = (r["alpha_per_position"] + [None] * POSITIONS)[:POSITIONS]
        interval = "-" if r["speedup_low"] is None else \
            f"{r['speedup_low']:.2f}-{r['speedup_high']:.2f}x"
        vs = r.get("vs_first")
        over = "-" if vs is None else \
            f"{vs['speedup']:.2f}x ({vs['low']:.2f}-{vs['high']:.2f}) over {vs['draft']}"
        lines.append(f"| {r['domain']} | {r['draft']} | {r['prompts']} | "
                     f"{r['speedup']:.2f}x | {interval} | {over} | {f(r['tau'], '{:.2f}')} | "
                     f"{f(r['alpha'])} | " + " | ".join(f(a) for a in pos)
                     + f" | {f(r['c'])} | {f(r['c_round'])} | {f(r['k_used'], '{}')} | "
                     f"{r['dtype']} | {r['verify']} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    domains = list(dict.fromkeys(r["domain"] for r in rows))
    drafts = list(dict.fromkeys(r["draft"] for r in rows))
    fig, ax = plt.subplots(figsize=(6.4, 4))
    width = 0.8 / len(drafts)
    for j, name in enumerate(drafts):
        mine = {r["domain"]: r for r in rows if r["draft"] == name}
        xs = [i + j * width for i in range(len(domains))]
        ys = [mine[d]["speedup"] for d in domains]
        err = [[y - (mine[d]["speedup_low"] or y) for d, y in zip(domains, ys)],
               [(mine[d]["speedup_high"] or y) - y for d, y in zip(domains, ys)]]
        ax.bar(xs, ys, width, yerr=err, capsize=3, label=name)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks([i + width * (len(drafts) - 1) / 2 for i in range(len(domains))], domains)
    ax.set_ylabel("speedup over plain decoding (95% interval)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
