"""Load test for ``draftkit serve``: throughput, latency and tau at several concurrencies.

Runs N chat requests at each concurrency (default 1, 4, 16) and prints one table row per
(K mode, concurrency): output tokens/s over the wall time, p50 and p99 request latency, and
tau (tokens per target call, pooled over the requests from the server's per-request
``draftkit`` stats) with the mean K the server used.

Against a running server::

    python serve/load_test.py --url http://127.0.0.1:8000/v1 --requests 32

Or let it start the server for each K mode (off = K 0, an integer = fixed K, auto), which
gives the benchmark table of issue 7 in one command::

    python serve/load_test.py --bundle BUNDLE --modes off,3,auto --requests 32 --max-tokens 64

Every mode's server is up at once (an idle one only waits; models that do not fit twice: one
mode a run, or ``--url``), and at each concurrency the modes take turns, one batch of
``--requests`` each, so that they are compared seconds apart, not minutes. ``--repeats 3``
runs every (mode, concurrency) three times, the modes' order rotated each time so that a slow
spell of a shared machine falls on each of them alike, and ends with the median of each (mode,
concurrency) and each mode's tokens/s against ``off`` (K 0) and against the best fixed K at
that concurrency: the median of the per-repeat ratios and their range.

Options: ``--concurrency 1,4,16``, ``--temperature 0``, ``--prompts FILE.jsonl`` (one string
or {"prompt"} / {"messages"} per line, as ``draftkit generate --prompts`` reads them; default:
a built-in mix), ``--max-batch 16``, ``--max-model-len 1024``, ``--serve-arg=--device=cpu``
(repeatable, passed to the server). Needs ``openai`` (pip install 'draftkit[test]').
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

from draftkit.chat import read_prompts
from draftkit.errors import DraftkitError

PROMPTS = [
    "Write a haiku about rain.", "What is 17 * 23? Show your steps.",
    "Explain what a hash table is in two sentences.", "Translate 'good morning' into French.",
    "Write a Python function that reverses a string.", "List three uses of copper.",
    "Summarise the plot of Romeo and Juliet in one paragraph.", "Why is the sky blue?",
    "Give me a short story about a robot learning to paint.", "What is the capital of Japan?",
    "Write a limerick about a cat.", "How do I sort a list of dicts by a key in Python?",
    "Name the planets of the solar system.", "What causes the seasons on Earth?",
    "Write a SQL query that counts rows per day.", "Describe photosynthesis simply.",
]


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))] if xs else 0.0


async def run_level(url: str, model: str, prompts: list, n: int, concurrency: int,
                    max_tokens: int, temperature: float) -> dict:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url, api_key="x", max_retries=0, timeout=600)
    gate = asyncio.Semaphore(concurrency)
    lat, tokens, calls, drafted = [], 0, 0, 0

    async def one(i: int) -> None:
        nonlocal tokens, calls, drafted
        p = prompts[i % len(prompts)]
        messages = p if isinstance(p, list) else [{"role": "user", "content": p}]
        async with gate:
            t0 = time.perf_counter()
            r = await client.chat.completions.create(model=model, messages=messages,
                                                     max_tokens=max_tokens,
                                                     temperature=temperature)
            lat.append(time.perf_counter() - t0)
        spec = (r.model_extra or {}).get("draftkit", {})
        tokens += r.usage.completion_tokens
        calls += spec.get("target_calls", 0)
        drafted += spec.get("drafted", 0)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.perf_counter() - t0
    await client.close()
    rounds = calls - n  # the prefill of each request is not a round
    return {"tokens_per_s": tokens / wall, "p50": percentile(lat, 50), "p99": percentile(lat, 99),
            "tau": tokens / calls if calls else 0.0,
            "k": drafted / rounds if rounds > 0 else 0.0, "tokens": tokens, "wall": wall}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, k: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "draftkit", "serve", "--port", str(port), "--k", k,
           "--max-batch", str(args.max_batch), "--log-level", "warning"]
    cmd += [args.bundle] if args.bundle else []
    cmd += ["--target", args.target] if args.target else []
    cmd += ["--draft", args.draft] if args.draft else []
    cmd += ["--max-model-len", str(args.max_model_len)] if args.max_model_len else []
    cmd += args.serve_arg
    return launch(cmd, port, args.startup_timeout)


def launch(cmd: list[str], port: int, timeout: float) -> tuple[subprocess.Popen, str]:
    """Run ``cmd`` (a server on ``port``) and wait for its /health: (process, API URL)."""
    import httpx

    proc = subprocess.Popen(cmd, env=os.environ.copy())
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}: {' '.join(cmd)}")
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return proc, f"{base}/v1"
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("the server did not come up in time")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def model_name(url: str) -> str:
    import httpx

    return httpx.get(f"{url}/models", timeout=10).json()["data"][0]["id"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="base URL of a running server (…/v1)")
    ap.add_argument("--bundle", help="start `draftkit serve BUNDLE` for each --modes entry")
    ap.add_argument("--target", help="with --bundle or instead of it: the target")
    ap.add_argument("--draft", help="with --target: the draft")
    ap.add_argument("--modes", default="off,3,auto", help="K modes: off (= 0), an int, auto")
    ap.add_argument("--concurrency", default="1,4,16", help="comma-separated levels")
    ap.add_argument("--requests", type=int, default=32, help="requests per level")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--prompts", help="JSONL prompts file")
    ap.add_argument("--max-batch", type=int, default=16, help="server slots (--max-batch)")
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="extra argument for the server, e.g. --serve-arg=--device=cpu")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of every mode, in rotated order; medians and ratios at the end")
    ap.add_argument("--startup-timeout", type=float, default=300)
    args = ap.parse_args(argv)
    if not args.url and not (args.bundle or args.target):
        ap.error("give --url of a running server, or --bundle / --target to start one")
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    try:
        prompts = read_prompts(args.prompts) if args.prompts else PROMPTS
    except DraftkitError as e:
        raise SystemExit(f"load_test: {e}") from None
    levels = [int(c) for c in args.concurrency.split(",")]
    modes = ["url"] if args.url else [m.strip() for m in args.modes.split(",")]
    print("| repeat | K mode | concurrency | requests | tokens/s | p50 s | p99 s | tau | mean K |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    runs: dict[tuple[str, int], list[float]] = {}  # (mode, concurrency) -> tokens/s per repeat
    servers = open_servers(args, modes)
    try:
        for mode, (_, url) in servers.items():  # each server's first requests are slow
            measure(args, url, prompts, 4, min(4, args.requests))
        for r in range(args.repeats):
            for i, c in enumerate(levels):
                turn = (r + i) % len(modes)  # rotated per repeat and per level
                for mode in modes[turn:] + modes[:turn]:
                    row = measure(args, servers[mode][1], prompts, c, args.requests)
                    runs.setdefault((mode, c), []).append(row["tokens_per_s"])
                    print(f"| {r + 1} | {mode} | {c} | {args.requests} | "
                          f"{row['tokens_per_s']:.1f} | {row['p50']:.2f} | {row['p99']:.2f} | "
                          f"{row['tau']:.2f} | {row['k']:.2f} |", flush=True)
    finally:
        for proc, _ in servers.values():
            if proc is not None:
                stop_server(proc)
    if args.repeats > 1 or len(modes) > 1:
        print_summary(runs, modes, levels)


def open_servers(args, modes: list[str]) -> dict[str, tuple]:
    """mode -> (server process or None, API URL): the running server, or one started per K
    mode, all up at once (an idle one only waits) so that the modes take turns request batch
    by request batch, seconds apart: a shared machine's speed moved by half between runs
    minutes apart (K 0 at concurrency 16: 106, 142, 170 tokens/s in three repeats)."""
    if modes == ["url"]:
        return {"url": (None, args.url)}
    servers: dict[str, tuple] = {}
    try:
        for mode in modes:
            servers[mode] = start_server(args, "0" if mode == "off" else mode)
    except BaseException:
        for proc, _ in servers.values():
            stop_server(proc)
        raise
    return servers


def measure(args, url: str, prompts: list, concurrency: int, requests: int) -> dict:
    """``requests`` requests at ``concurrency`` against the server at ``url``."""
    return asyncio.run(run_level(url, model_name(url), prompts, requests, concurrency,
                                 args.max_tokens, args.temperature))


def take_turns(args, urls: dict[str, str], levels: list[int], sizes: dict[int, int],
               repeats: int, column: str = "server", on_row=None) -> dict:
    """Each of ``urls`` (name -> API URL) sent the same batches, batch by batch in turn, the
    order rotated every repeat and level, so a slow spell of a shared machine falls on all
    alike; prints each batch. -> {(name, concurrency): tokens/s per repeat}. ``on_row(name, c,
    row)``: called with each batch's figures."""
    for url in urls.values():  # each server's first requests are slow
        measure(args, url, PROMPTS, 4, 4)
    print(f"| repeat | {column} | concurrency | requests | tokens/s | p50 s |")
    print("|---|---|---|---|---|---|", flush=True)
    runs: dict[tuple[str, int], list[float]] = {}
    for r in range(repeats):
        for i, c in enumerate(levels):
            order = list(urls) if (r + i) % 2 == 0 else list(reversed(urls))
            for name in order:
                row = measure(args, urls[name], PROMPTS, c, sizes[c])
                runs.setdefault((name, c), []).append(row["tokens_per_s"])
                if on_row is not None:
                    on_row(name, c, row)
                print(f"| {r + 1} | {name} | {c} | {sizes[c]} | {row['tokens_per_s']:.1f} | "
                      f"{row['p50']:.2f} |", flush=True)
    return runs


def ratio(runs: dict, mode: str, base: str, c: int) -> str:
    """Median and range over the repeats of mode's tokens/s over base's in the same repeat."""
    xs = [a / b for a, b in zip(runs[(mode, c)], runs[(base, c)])]
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


def print_summary(runs: dict, modes: list[str], levels: list[int]) -> None:
    """Median tokens/s per (mode, concurrency); each mode against K 0 and the best fixed K."""
    fixed = [m for m in modes if m.isdigit()]
    print("\n| K mode | concurrency | median tokens/s | vs off | vs best fixed K |")
    print("|---|---|---|---|---|")
    for c in levels:
        med = {m: statistics.median(runs[(m, c)]) for m in modes}
        best = max(fixed, key=med.get) if fixed else None
        for m in modes:
            vs_off = ratio(runs, m, "off", c) if "off" in modes and m != "off" else ""
            vs_best = f"{ratio(runs, m, best, c)} (K {best})" if best and m != best else ""
            print(f"| {m} | {c} | {med[m]:.1f} | {vs_off} | {vs_best} |")


if __name__ == "__main__":
    main()
