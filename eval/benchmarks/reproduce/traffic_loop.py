"""The loop from served traffic, end to end: serve, record, see the drift, refresh, swap, measure.

1. ``draftkit serve BUNDLE --record DIR`` serves the bundle (by default the quickstart's) with
   recording on and an admin token;
2. the official ``openai`` client sends shifted traffic, one request at a time: chat,
   summarization and translation prompts that draftkit ships for training
   (``eval/train_prompts``, never the eval suites' prompts), beside code and math, the domains
   the quickstart's head was trained on;
3. ``draftkit traffic DIR --bundle BUNDLE`` shows served acceptance per domain and flags the
   domains that drifted below the bundle's eval;
4. ``draftkit refresh`` retrains the head on the recorded traffic for ``--steps`` steps;
5. the new bundle is swapped into the running server through its admin endpoint while requests
   are in flight (none may fail; each finishes on one draft; /metrics shows both);
6. held-out requests (prompts not sent before) go in turn, the order rotating, to that server
   (the new draft), to a second serving the old bundle and to a third decoding plainly;
7. per domain and over the mix: alpha at the first draft position of each draft on those
   requests (from the recorded rounds), each draft's served speedup over plain and the new
   one's over the old (tokens/s of the same requests, paired), with 95% bootstrap intervals
   over requests.

Run from the repository root on the quickstart's bundle::

    OMP_NUM_THREADS=2 python eval/benchmarks/reproduce/traffic_loop.py \\
        --bundle runs/quickstart/bundle --out runs/traffic-loop

It prints each stage's output and the final table, and writes ``loop.json`` and ``loop.md``
to ``--out``.

``--engine vllm`` runs the same loop through vLLM (its CPU build here, ``make engines``):
every server is ``draftkit serve BUNDLE --engine vllm`` (vLLM's own OpenAI server behind
draftkit's front, ``--replicas`` of them), the refresh has vLLM answer the recipe's prompts
and capture the head's features (``data.generate.engine=vllm teacher.features=vllm``), the
swap is vLLM's blue/green one with 8 requests in flight, and the held-out requests go to the
swapped server and to one serving the old bundle. The bar there is acceptance: vLLM's served
alpha_1 per domain before and after with intervals (no plain server, no speedup).
``--requests-for chat=185`` records more traffic of one domain than ``--train-requests``
(the prompts after the held-out ones; the held-out prompts stay the same)::

    OMP_NUM_THREADS=2 python eval/benchmarks/reproduce/traffic_loop.py --engine vllm \
        --bundle runs/quickstart/bundle --out runs/traffic-loop-vllm --k 3
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SHIFTED = ("chat", "summarization", "translation")
TRAINED = ("code", "math")


def signing_key(out: Path) -> None:
    """The key the refresh signs its bundle with: $DRAFTKIT_SIGNING_KEY, else a pair made in
    OUT/keys for this run (the refreshed bundle is signed, as every bundle is)."""
    from draftkit.signing import KEY_ENV, new_key_pair

    if not os.environ.get(KEY_ENV):
        private = out / "keys" / "draftkit.key"
        os.environ[KEY_ENV] = str(private if private.is_file() else new_key_pair(out / "keys")[0])


def prompts(domain: str) -> list[list[dict]]:
    """The domain's training prompts as chat messages (a row holds a prompt or a chat)."""
    path = ROOT / "eval" / "train_prompts" / f"{domain}.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r.get("messages") or [{"role": "user", "content": r["prompt"]}] for r in rows]


def load_test():
    """serve/load_test.py, whose server launcher the loop uses."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("load_test", ROOT / "serve" / "load_test.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def start_server(bundle: str, k: str, *extra: str, engine: str = "draftkit"):
    """``draftkit serve BUNDLE`` on a free port, as serve/load_test.py starts one: (process,
    base URL of the API) once /health answers. ``engine`` vllm: vLLM behind the front (its
    own K: the bundle's)."""
    from types import SimpleNamespace

    lt = load_test()
    if engine == "vllm":
        port = lt.free_port()
        return lt.launch([sys.executable, "-m", "draftkit", "serve", bundle, "--engine", "vllm",
                          "--port", str(port), "--log-level", "warning", *extra], port, 900)
    args = SimpleNamespace(bundle=bundle, target=None, draft=None, max_model_len=None,
                           serve_arg=list(extra), startup_timeout=600, max_batch=4)
    return lt.start_server(args, k)


def send(client, model: str, domain: str, texts: list[list[dict]], max_tokens: int, phase: str
         ) -> list[dict]:
    """One request at a time; (domain, prompt index, seconds, completion tokens, draftkit
    stats) per request."""
    from tqdm.auto import tqdm

    out = []
    for i, messages in enumerate(tqdm(texts, desc=f"{phase} {domain}", unit="request",
                                      disable=len(texts) < 2)):
        t = time.perf_counter()
        r = client.chat.completions.create(
            model=model, messages=messages, max_tokens=max_tokens,
            temperature=0.0, metadata={"domain": domain})
        secs = time.perf_counter() - t
        out.append({"domain": domain, "index": i, "seconds": secs,
                    "tokens": r.usage.completion_tokens,
                    "draftkit": (r.model_extra or {}).get("draftkit")})
    return out


def run(cmd: list[str]) -> int:
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.call(cmd)


def alpha_1(records) -> float | None:
    accepted = tested = 0
    for r in records:
        a, t = r.per_position(1)
        accepted, tested = accepted + a[0], tested + t[0]
    return accepted / tested if tested else None


def bootstrap_alpha_1(records, resamples: int = 2000) -> tuple[float | None, float | None]:
    from draftkit import metrics

    counts = [r.per_position(1) for r in records]
    counts = [(a[0], t[0]) for a, t in counts if t[0]]
    if len(counts) < 2:
        return None, None

    def stat(idx):
        a = sum(counts[i][0] for i in idx)
        t = sum(counts[i][1] for i in idx)
        return a / t if t else 0.0
    return metrics.bootstrap(stat, len(counts), resamples)[1:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default="runs/quickstart/bundle")
    ap.add_argument("--out", default="runs/traffic-loop")
    ap.add_argument("--train-requests", type=int, default=46, help="per domain, before refresh")
    ap.add_argument("--heldout-requests", type=int, default=12, help="per domain, after")
    ap.add_argument("--requests-for", action="append", default=[], metavar="DOMAIN=N",
                    help="more traffic for one domain: N requests before the refresh, the "
                         "prompts after the held-out ones added (the held-out set unchanged)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=320, help="refresh training steps")
    ap.add_argument("--traffic-repeat", type=int, default=5,
                    help="refresh: times each traffic request is trained an epoch")
    ap.add_argument("--k", default="auto", help="the servers' --k: auto, or a fixed K (the "
                                                "bundle's, to compare drafts by acceptance alone)")
    ap.add_argument("--engine", choices=("draftkit", "vllm"), default="draftkit",
                    help="the engine every server runs")
    ap.add_argument("--replicas", type=int, default=1, help="--engine vllm: vLLM servers the "
                                                            "recording front starts")
    args = ap.parse_args(argv)
    vllm = args.engine == "vllm"
    domains, n, h = SHIFTED + TRAINED, args.train_requests, args.heldout_requests
    more = dict(x.partition("=")[::2] for x in args.requests_for)
    for d, count in more.items():
        if d not in domains or not count.isdigit() or int(count) < n:
            ap.error(f"--requests-for {d}={count}: expected DOMAIN=N with DOMAIN one of "
                     f"{', '.join(domains)} and N at least --train-requests ({n})")

    from openai import OpenAI

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    signing_key(out)
    new = out / "bundle-refreshed"
    token = secrets.token_hex(16)
    model = Path(args.bundle).resolve().name
    texts = {d: prompts(d) for d in domains}
    heldout = [(d, m) for d in domains for m in texts[d][n:n + h]]
    traffic = {d: texts[d][:n] + texts[d][n + h:][:int(more.get(d, n)) - n] for d in domains}
    started = time.perf_counter()
    servers = []

    def serve(bundle: str, *extra: str, k: str = args.k):
        proc, api = start_server(bundle, k, *extra, engine=args.engine)
        servers.append(proc)
        return OpenAI(base_url=api, api_key="none", timeout=900), api.removesuffix("/v1")

    try:
        # A: the bundle, recording, with an admin token; it takes the new draft later
        live, url = serve(args.bundle, "--record", str(out / "traffic"),
                          "--admin-token", token, *(
                              ("--replicas", str(args.replicas), "--engine-log-dir",
                               str(out / "logs")) if vllm else ()))
        for d in domains:  # the traffic the refresh learns from
            send(live, model, d, traffic[d], args.max_tokens, "traffic")
        time.sleep(2)  # the recorder's writer thread writes what is queued
        run([sys.executable, "-m", "draftkit", "traffic", str(out / "traffic"), "--bundle",
             args.bundle, "--out", str(out / "drift")])
        # A stays up (idle) while the draft retrains on what it recorded
        # through vLLM, vLLM answers the recipe's prompts and captures the head's features
        engine = ["data.generate.engine=vllm", "teacher.features=vllm"] if vllm else []
        refreshed = run([sys.executable, "-m", "draftkit", "refresh", args.bundle, "--traffic",
                         str(out / "traffic"), "--out", str(new), "--steps",
                         str(args.steps), "--traffic-repeat", str(args.traffic_repeat),
                         *(["--k", args.k] if args.k != "auto" else []), *engine]) == 0
        if not refreshed:
            print("the refresh exported no bundle; nothing to swap", flush=True)
            return 1
        swap = swap_under_load(live, url, model, token, new, heldout[:8 if vllm else 4],
                               args.max_tokens)
        # B: the old draft, C: plain decoding; the held-out requests go to A, B and C in turn
        old, _ = serve(args.bundle, "--record", str(out / "traffic-old"))
        clients = {"new": live, "old": old}
        if not vllm:  # vLLM's front serves a bundle's draft: no plain server to time against
            clients["plain"] = serve(args.bundle, "--draft", "none", k="0")[0]
        timed = interleaved(clients, model, heldout, args.max_tokens)
    finally:
        for proc in servers:
            proc.send_signal(signal.SIGINT)
        for proc in servers:
            proc.wait(60)
    rows = figures(out, domains, timed, swap["draft"])
    table = markdown(rows, args, swap, time.perf_counter() - started)
    (out / "loop.json").write_text(json.dumps({"rows": rows, "swap": swap}, indent=2) + "\n")
    (out / "loop.md").write_text(table + "\n")
    print(table)
    return 0


def swap_under_load(client, url: str, model: str, token: str, bundle: Path,
                    requests: list, max_tokens: int) -> dict:
    """Post the new bundle to the admin endpoint while ``requests`` are in flight: each must
    finish, on one draft; /metrics must show both drafts."""
    import threading

    import httpx

    results: list = []

    def one(domain, messages):
        try:
            results.append(send(client, model, domain, [messages], max_tokens, "during swap")[0])
        except Exception as e:  # counted: the bar is that none fails
            results.append({"error": f"{type(e).__name__}: {e}"})

    threads = [threading.Thread(target=one, args=r) for r in requests]
    for t in threads:
        t.start()
    time.sleep(0.5)
    r = httpx.post(f"{url}/admin/draft", json={"bundle": str(bundle)},
                   headers={"Authorization": f"Bearer {token}"}, timeout=600)
    for t in threads:
        t.join()
    print(f"swap: HTTP {r.status_code} {r.text}", flush=True)
    r.raise_for_status()
    info = [line for line in httpx.get(f"{url}/metrics").text.splitlines()
            if line.startswith("draftkit:draft_info")]
    failed = [x for x in results if "error" in x]
    on = sorted({(x["draftkit"] or {}).get("draft") for x in results if "error" not in x})
    print(f"during the swap: {len(results)} requests, {len(failed)} failed, drafts {on}; "
          f"/metrics: {info}", flush=True)
    return {"draft": r.json()["draft"], "previous": r.json()["previous"],
            "in_flight": len(results), "failed": len(failed), "drafts_seen": on,
            "draft_info": info}


def interleaved(clients: dict, model: str, requests: list, max_tokens: int) -> dict:
    """Each request sent to every server in turn, the order rotating from request to request,
    so the machine's drifts fall on all alike: name -> one timing per request."""
    names = list(clients)
    timed: dict = {name: [] for name in names}
    for i, (domain, messages) in enumerate(requests):
        for name in names[i % len(names):] + names[:i % len(names)]:
            timed[name].append(send(clients[name], model, domain, [messages], max_tokens,
                                    f"held-out {i + 1}/{len(requests)}, {name}")[0])
    return timed


def figures(out: Path, domains, timed: dict, new_draft: str) -> list[dict]:
    """Per domain and over the mix: alpha_1 of each draft on the held-out requests (their
    recorded rounds), each draft's served speedup over plain and the new one's over the old,
    with 95% intervals over requests."""
    from draftkit import metrics
    from draftkit.traffic.shards import read_traffic

    n = len(timed["new"])
    recorded = {"new": [r for r in read_traffic(out / "traffic") if r.draft == new_draft][-n:],
                "old": read_traffic(out / "traffic-old")[-n:]}
    rows = []
    for d in [*domains, None]:
        row = {"domain": d or "mix", "shifted": d in SHIFTED}
        for name in ("old", "new"):
            mine = [r for r in recorded[name] if d is None or r.domain == d]
            row[f"alpha_1_{name}"] = alpha_1(mine)
            row[f"alpha_1_{name}_interval"] = list(bootstrap_alpha_1(mine))
        pick = {k: [x for x in v if d is None or x["domain"] == d] for k, v in timed.items()}
        for name, base, over in (("old_over_plain", "plain", "old"),
                                 ("new_over_plain", "plain", "new"),
                                 ("new_over_old", "old", "new")):
            if base not in pick:
                row[name] = None
                continue
            a, b = pick[base], pick[over]
            row[name] = list(metrics.speedup_interval(
                [x["seconds"] for x in a], [x["seconds"] for x in b],
                [x["tokens"] for x in a], [x["tokens"] for x in b]))
        rows.append(row)
    return rows


def markdown(rows, args, swap: dict, seconds: float) -> str:
    def f(x):
        return "-" if x is None else f"{x:.3f}"

    def band(v):
        return "-" if not v or v[1] is None else f"{v[0]:.2f}x ({v[1]:.2f}-{v[2]:.2f})"

    counts = ", ".join([str(args.train_requests), *args.requests_for])
    lines = [f"# Traffic loop ({args.engine}): {args.bundle}, K {args.k}, {counts} requests per "
             f"domain recorded, refresh {args.steps} steps (traffic x{args.traffic_repeat}), "
             f"{args.heldout_requests} held-out requests per domain ({seconds / 60:.1f} min in "
             f"all)", "",
             "| domain | shifted | alpha_1 old | alpha_1 new | gain | old vs plain | new vs plain "
             "| new vs old |", "|---|---|---|---|---|---|---|---|"]
    def alpha(r, name):
        lo, hi = r[f"alpha_1_{name}_interval"]
        return f(r[f"alpha_1_{name}"]) + ("" if lo is None else f" ({lo:.3f}-{hi:.3f})")

    for r in rows:
        a, b = r["alpha_1_old"], r["alpha_1_new"]
        gain = None if a is None or b is None else b - a
        lines.append(f"| {r['domain']} | {'yes' if r['shifted'] else 'no'} | {alpha(r, 'old')} | "
                     f"{alpha(r, 'new')} | "
                     f"{f(gain)} | {band(r['old_over_plain'])} | {band(r['new_over_plain'])} | "
                     f"{band(r['new_over_old'])} |")
    lines += ["", f"Swap under load: {swap['in_flight']} requests in flight, {swap['failed']} "
                  f"failed, drafts {swap['drafts_seen']}; /metrics {swap['draft_info']}"]
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
