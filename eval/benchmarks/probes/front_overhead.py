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
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "serve"))
import load_test as lt  # noqa: E402  (serve/load_test.py: the load test's client and helpers)


def start_front(bundle: str, upstream: str, record: Path) -> tuple[subprocess.Popen, str]:
    port = lt.free_port()
    return lt.launch([sys.executable, "-m", "draftkit", "serve", bundle, "--upstream", upstream,
                      "--port", str(port), "--record", str(record), "--log-level", "warning"],
                     port, 300)


def main(argv: list[str] | None = None) -> int:
    from draftkit.metrics import bootstrap
    from draftkit.serve import replicas as R
    from draftkit.traffic.shards import read_traffic

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
    levels = [int(c) for c in args.concurrency.split(",")]
    sizes = dict(zip(levels, (int(n) for n in args.requests.split(","))))
    client = argparse.Namespace(max_tokens=args.max_tokens, temperature=0.0)
    launch = R.Launch.find("served", args.engine_python,
                           engine_args=tuple(args.engine_args.split()))
    replica = R.start(launch, args.bundle, {}, 0)
    front = None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            R.wait_ready([replica])
            front = start_front(args.bundle, replica.url, Path(tmp) / "traffic")
            print(f"vLLM {launch.release} at {replica.url}; front at {front[1]}")
            runs = lt.take_turns(client, {"direct": f"{replica.url}/v1", "front": front[1]},
                                 levels, sizes, args.repeats, column="path")
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
