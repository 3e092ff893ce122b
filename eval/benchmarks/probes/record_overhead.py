"""What ``draftkit serve --record`` costs in tokens/s under load (the bar, issue 45: at most 2%).

Starts two servers on the same models, one recording into a temporary folder and one not, both
up at once (an idle one only waits), and sends each the same batches of chat requests with
serve/load_test.py's client (``measure``), the two taking turns batch by batch in an order
rotated every repeat, so a slow spell of a shared machine falls on both alike. Prints each
batch, then per concurrency each one's median tokens/s and the loss, 1 - record / off, as the
median over the repeats of the paired ratios with a 95% bootstrap interval. Server flags are
load_test's (``--bundle`` or ``--target`` / ``--draft``, ``--k``).

A shared machine moves tokens/s by more than the bar between batches, so it also times the
recorder alone, in this process: the CPU a record costs, from the scheduler's hand-off
(``Recorder.add``) to its line written, over ``--records`` records the size of a served request
(``--repeats 0``: this alone). That CPU times requests per second is the share of a core
recording takes. Command (2 CPU cores, a
draft of three of the target's layers: ``draftkit derive --target embedded --layers 0,1,2
--out /tmp/draft3``)::

    OMP_NUM_THREADS=1 python eval/benchmarks/probes/record_overhead.py --target embedded \\
        --draft /tmp/draft3 --k 2 --repeats 6
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def load_test():
    """serve/load_test.py (a script, not a module of the package)."""
    spec = importlib.util.spec_from_file_location("load_test", ROOT / "serve" / "load_test.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    from draftkit.metrics import bootstrap
    from draftkit.traffic.shards import read_traffic

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle")
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--k", default="2", help="the servers' --k (fixed: both decode alike)")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--requests", default="8,16", help="requests per batch, per concurrency")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--serve-arg", action="append", default=[])
    ap.add_argument("--records", type=int, default=2000, help="records timed in-process")
    args = ap.parse_args(argv)
    per_record = record_cpu(args.records, args.max_tokens)
    print(f"recorder alone: {per_record * 1e6:.0f} us of CPU a record (hand-off, JSON, write; "
          f"a 200-token prompt, {args.max_tokens}-token completion)")
    if args.repeats < 1:
        return 0
    if not (args.bundle or args.target):
        ap.error("give --bundle or --target")
    lt = load_test()
    levels = [int(c) for c in args.concurrency.split(",")]
    sizes = dict(zip(levels, (int(n) for n in args.requests.split(","))))
    server = argparse.Namespace(bundle=args.bundle, target=args.target, draft=args.draft,
                                max_batch=args.max_batch, max_model_len=args.max_model_len,
                                startup_timeout=300, max_tokens=args.max_tokens,
                                temperature=0.0)
    requests_per_s: dict[int, list[float]] = {}  # the recording server's, per concurrency
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "traffic"
        servers = {}
        try:
            for mode, extra in (("off", []), ("record", ["--record", str(folder)])):
                server.serve_arg = args.serve_arg + extra
                servers[mode] = lt.start_server(server, args.k)

            def count(mode: str, c: int, row: dict) -> None:
                if mode == "record":
                    requests_per_s.setdefault(c, []).append(sizes[c] / row["wall"])

            runs = lt.take_turns(server, {m: url for m, (_, url) in servers.items()}, levels,
                                 sizes, args.repeats, on_row=count)
        finally:
            for proc, _ in servers.values():
                lt.stop_server(proc)
        recorded = len(read_traffic(folder))
    print(f"\n{recorded} requests recorded\n")
    print("| concurrency | off median tokens/s | record median tokens/s | loss (95% interval) "
          "| recorder CPU share |")
    print("|---|---|---|---|---|")
    for c in levels:
        off, rec = runs[("off", c)], runs[("record", c)]
        ratios = [b / a for a, b in zip(off, rec)]
        loss, lo, hi = bootstrap(lambda idx: 1 - statistics.median(ratios[i] for i in idx),
                                 len(ratios), resamples=2000)
        share = per_record * statistics.median(requests_per_s[c])
        print(f"| {c} | {statistics.median(off):.1f} | {statistics.median(rec):.1f} | "
              f"{loss:+.1%} ({lo:+.1%} to {hi:+.1%}) | {share:.3%} |")
    return 0


def record_cpu(n: int, completion: int, prompt: int = 200, k: int = 2) -> float:
    """CPU seconds a record costs (both threads): ``n`` records handed to a recorder as the
    scheduler hands them (a SamplingEntry and copies of the id lists), then written."""
    import time

    from draftkit.traffic.record import SamplingEntry
    from draftkit.traffic.recorder import Recorder

    prompt_ids, completion_ids = list(range(prompt)), list(range(completion))
    rounds = [[k, 1]] * (completion // 2)
    with tempfile.TemporaryDirectory() as tmp:
        rec = Recorder(Path(tmp), target="t" * 16, tokenizer="k" * 16)
        rec.start()
        cpu = time.process_time()
        for i in range(n):
            sampling = SamplingEntry(temperature=0.0, top_p=1.0, top_k=0, seed=None,
                                     max_tokens=completion)
            rec.add(domain="code", prompt_ids=list(prompt_ids),
                    completion_ids=list(completion_ids), sampling=sampling,
                    finish_reason="length", rounds=list(rounds), draft="d" * 16)
        rec.stop()  # the writer drains the queue
        assert rec.written == n
        return (time.process_time() - cpu) / n


if __name__ == "__main__":
    raise SystemExit(main())
