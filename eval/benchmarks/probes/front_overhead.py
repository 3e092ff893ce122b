"""What draftkit's front costs in front of vLLM, in tokens/s (the bar: at most 3% at concurrency 1
and 16).

Starts one vLLM server with the bundle, as ``draftkit serve --engine vllm`` starts a replica
(the bundle's preflight command, per-request speculative metrics on), then a front over it
(``draftkit serve BUNDLE --upstream URL --record TMP``: passing, recording and counting), and
sends the same batches of chat requests (serve/load_test.py's client) to vLLM directly and
through the front, the two taking turns batch by batch in an order rotated every repeat, so a
slow spell of a shared machine falls on both alike. Both paths reach the same server, so the
difference is the front's. Prints each batch, then per concurrency each path's median tokens/s
and the cost, 1 - front / direct, as the median over the repeats of the paired ratios with a
95% bootstrap interval, and how many requests the front recorded. Command (2 CPU cores, the
quickstart's bundle)::

    OMP_NUM_THREADS=2 python eval/benchmarks/probes/front_overhead.py \\
        --bundle runs/quickstart/bundle --repeats 6

On a machine whose CPUs also run vLLM (the CPU build) the front's own CPU competes with the
engine's; on GPUs it does not.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def load_test():
    """serve/load_test.py (a script, not a module of the package)."""
    spec = importlib.util.spec_from_file_location("load_test", ROOT / "serve" / "load_test.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def start_front(bundle: str, upstream: str, record: Path) -> tuple[subprocess.Popen, str]:
    import httpx

    lt = load_test()
    port = lt.free_port()
    cmd = [sys.executable, "-m", "draftkit", "serve", bundle, "--upstream", upstream,
           "--port", str(port), "--record", str(record), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=os.environ.copy())
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"the front exited with {proc.returncode}: {' '.join(cmd)}")
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return proc, f"{base}/v1"
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("the front did not come up in time")


def main(argv: list[str] | None = None) -> int:
    from draftkit.metrics import bootstrap
    from draftkit.serve import replicas as R
    from draftkit.traffic.record import read_traffic

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True, help="a bundle from draftkit export")
    ap.add_argument("--engine-python", default=None, help="the Python of vLLM's environment")
    ap.add_argument("--engine-args", default="--max-model-len 2048 --max-num-seqs 16",
                    help="vLLM's own flags for the server, quoted as one word")
    ap.add_argument("--concurrency", default="1,16", help="concurrency levels, comma-separated")
    ap.add_argument("--requests", default="8,32", help="requests per batch, per concurrency")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per answer")
    ap.add_argument("--repeats", type=int, default=6, help="batches per path and concurrency")
    args = ap.parse_args(argv)
    lt = load_test()
    levels = [int(c) for c in args.concurrency.split(",")]
    sizes = dict(zip(levels, (int(n) for n in args.requests.split(","))))
    client = argparse.Namespace(max_tokens=args.max_tokens, temperature=0.0)
    launch = R.Launch.find("served", args.engine_python,
                           engine_args=tuple(args.engine_args.split()))
    replica = R.start(launch, args.bundle, {}, 0)
    runs: dict[tuple[str, int], list[float]] = {}
    front = None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            R.wait_ready([replica])
            front = start_front(args.bundle, replica.url, Path(tmp) / "traffic")
            paths = {"direct": f"{replica.url}/v1", "front": front[1]}
            for url in paths.values():  # each path's first requests are slow
                lt.measure(client, url, lt.PROMPTS, 4, 4)
            print(f"vLLM {launch.release} at {replica.url}; front at {front[1]}")
            print("| repeat | path | concurrency | requests | tokens/s | p50 s |")
            print("|---|---|---|---|---|---|", flush=True)
            for r in range(args.repeats):
                for i, c in enumerate(levels):
                    order = list(paths) if (r + i) % 2 == 0 else list(reversed(paths))
                    for path in order:
                        row = lt.measure(client, paths[path], lt.PROMPTS, c, sizes[c])
                        runs.setdefault((path, c), []).append(row["tokens_per_s"])
                        print(f"| {r + 1} | {path} | {c} | {sizes[c]} | "
                              f"{row['tokens_per_s']:.1f} | {row['p50']:.2f} |", flush=True)
        finally:
            if front is not None:
                lt.stop_server(front[0])
            R.stop_all([replica])
        recorded = len(read_traffic(Path(tmp) / "traffic"))
    print(f"\n{recorded} requests recorded by the front\n")
    print("| concurrency | direct median tokens/s | front median tokens/s | cost (95% interval) |")
    print("|---|---|---|---|")
    for c in levels:
        direct, through = runs[("direct", c)], runs[("front", c)]
        ratios = [b / a for a, b in zip(direct, through)]
        cost, lo, hi = bootstrap(lambda idx: 1 - statistics.median(ratios[i] for i in idx),
                                 len(ratios), resamples=2000)
        print(f"| {c} | {statistics.median(direct):.1f} | {statistics.median(through):.1f} | "
              f"{cost:+.1%} ({lo:+.1%} to {hi:+.1%}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
