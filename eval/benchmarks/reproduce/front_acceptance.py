"""Acceptance as the vLLM front records it, against draftkit's own figures on the same prompts.

Serves the bundle twice, one after the other: ``draftkit serve BUNDLE --engine vllm --record``
(vLLM's own server behind the front) and ``draftkit serve BUNDLE --k K --record`` (draftkit's
engine), and sends each the same greedy requests: the suite's prompts for each domain, as the
token ids ``draftkit eval`` decodes (the target's chat template applied), labelled with their
domain. Then runs ``draftkit eval --k K`` on the same prompts. Prints per domain and draft
position the conditional alpha_i from the vLLM front's records, from the built-in server's
records and from eval's report, the largest difference from eval's (the bar: at most 0.03),
and how many greedy answers the two servers gave alike, all in one ``--dtype``. Writes the
table and the records' figures as JSON to ``--out``. Command (2 CPU cores, the quickstart's
bundle)::

    OMP_NUM_THREADS=2 python eval/benchmarks/reproduce/front_acceptance.py \\
        --bundle runs/quickstart/bundle --domains code math --limit 12 --max-tokens 128 \\
        --out runs/front-acceptance
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

from draftkit.chat import encode_prompt
from draftkit.evaluate.suite import builtin_suites_dir, load_suite
from draftkit.manifest import read_manifest
from draftkit.models import load_tokenizer
from draftkit.models.resolve import resolve_model
from draftkit.traffic.shards import read_traffic

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "serve"))
import load_test as lt  # noqa: E402  (serve/load_test.py: its server launcher)


def serve(argv: list[str], port: int) -> subprocess.Popen:
    return lt.launch([sys.executable, "-m", "draftkit", "serve", *argv, "--port", str(port),
                      "--log-level", "warning"], port, 600)[0]


def ask(port: int, prompts: list[tuple[str, list[int]]], max_tokens: int) -> None:
    """Each prompt's greedy answer, one request at a time (the servers record the ids)."""
    for domain, ids in prompts:
        body = {"prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                "metadata": {"domain": domain}}
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=600)
        if answer.status_code != 200:
            raise SystemExit(f"the server answered {answer.status_code}: {answer.text[:300]}")


def conditional(records, domain: str, k: int) -> list[float | None]:
    accepted, tested = [0] * k, [0] * k
    for r in records:
        if r.domain == domain:
            a, t = r.per_position(k)
            accepted = [x + y for x, y in zip(accepted, a)]
            tested = [x + y for x, y in zip(tested, t)]
    return [a / t if t else None for a, t in zip(accepted, tested)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True, help="a bundle from draftkit export")
    ap.add_argument("--suite", default=str(builtin_suites_dir()), help="suite file or folder")
    ap.add_argument("--domains", nargs="+", default=["code", "math"])
    ap.add_argument("--limit", type=int, default=12, help="prompts per domain")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens per answer")
    ap.add_argument("--k", type=int, default=None, help="K (default: the bundle's)")
    ap.add_argument("--dtype", default="float32", help="the dtype every engine runs in (vLLM "
                    "would serve the bundle's, bfloat16 as exported by default, beside "
                    "draftkit's float32 on a CPU: greedy answers part at near ties)")
    ap.add_argument("--engine-args", default="--max-model-len 2048 --max-num-seqs 4",
                    help="vLLM's own flags, quoted as one word")
    ap.add_argument("--out", default="runs/front-acceptance", help="folder for the results")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    k = args.k or read_manifest(args.bundle).num_speculative_tokens
    tok = load_tokenizer(resolve_model(args.bundle, "target"))
    rows = load_suite(args.suite, args.limit, args.domains)
    prompts = [(row.domain, encode_prompt(tok, row.prompt)) for row in rows]
    records = {}
    for name, flags in (("vllm", ["--engine", "vllm", "--engine-args",
                                  f"{args.engine_args} --dtype {args.dtype}"]),
                        ("draftkit", ["--k", str(k), "--max-batch", "1", "--dtype", args.dtype])):
        folder = out / f"traffic-{name}"
        if folder.exists():
            raise SystemExit(f"{folder} exists; give another --out")
        port = 8700 + len(records)
        proc = serve([args.bundle, *flags, "--record", str(folder)], port)
        try:
            started = time.perf_counter()
            ask(port, prompts, args.max_tokens)
            print(f"{name}: {len(prompts)} requests in {time.perf_counter() - started:.0f} s",
                  flush=True)
        finally:
            proc.terminate()
            proc.wait(120)
        records[name] = read_traffic(folder)
    subprocess.run([sys.executable, "-m", "draftkit", "eval", "--target",
                    str(resolve_model(args.bundle, "target").path), "--draft", args.bundle,
                    "--suite", args.suite, "--domains", *args.domains, "--limit",
                    str(args.limit), "--max-new-tokens", str(args.max_tokens), "--k", str(k),
                    "--k-sweep", "", "--batch-sizes", "", "--dtype", args.dtype, "--out",
                    str(out / "eval")],
                   check=True)
    report = json.loads((out / "eval" / "report.json").read_text())
    # one request at a time: the records are in the prompts' order
    same = sum(a.completion_ids == b.completion_ids and a.prompt_ids == b.prompt_ids
               for a, b in zip(records["vllm"], records["draftkit"]))
    print(f"\ngreedy answers alike (recorded ids), vLLM front and draftkit's server: {same} of "
          f"{len(prompts)}")
    table, worst = [], 0.0
    print("\n| domain | position | vLLM front records | draftkit server records | eval | "
          "front - eval |")
    print("|---|---|---|---|---|---|")
    for domain in args.domains:
        front, own = conditional(records["vllm"], domain, k), conditional(records["draftkit"],
                                                                          domain, k)
        evaluated = report["domains"][domain]["alpha_per_position"]
        for i in range(k):
            e = evaluated[i] if i < len(evaluated) else None
            diff = None if front[i] is None or e is None else front[i] - e
            worst = max(worst, abs(diff)) if diff is not None else worst
            table.append({"domain": domain, "position": i + 1, "front": front[i],
                          "draftkit": own[i], "eval": e, "difference": diff})
            cell = [f"{x:.3f}" if x is not None else "-" for x in (front[i], own[i], e)]
            print(f"| {domain} | {i + 1} | {' | '.join(cell)} | "
                  f"{f'{diff:+.3f}' if diff is not None else '-'} |")
    print(f"\nlargest |front - eval|: {worst:.3f}")
    (out / "front_acceptance.json").write_text(json.dumps({
        "bundle": args.bundle, "k": k, "dtype": args.dtype, "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "greedy_alike": same, "largest_difference": worst, "rows": table}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
