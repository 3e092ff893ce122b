"""``draftkit serve BUNDLE --engine vllm``: vLLM's own OpenAI server, started by the front in
vLLM's environment through the bundle's preflight, behind the same API as draftkit's engine.

Greedy answers through the front are draftkit's tokens; the records the front writes carry
vLLM's accepted count of every verify step, which are draftkit's for the same requests; a
blue/green swap to a second bundle with 8 streams in flight fails none of them, and the records
name both drafts. (The front's every failure path runs against stand-in upstreams in
tests/serve/test_front.py.)"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from draftkit.decode.engine import SpeculativeEngine
from draftkit.export import export_bundle
from draftkit.models import load_pair
from draftkit.serve.command import ServeArgs, build
from draftkit.traffic.shards import read_traffic
from draftkit.traffic.replay import Replayer, rounds_before_end
from tests.helpers import LiveServer, engine_llama, make_tokenizer, noisy_copy, save_model

pytestmark = pytest.mark.engine

PROMPTS = [[5, 17, 33, 9], [40, 2, 2, 71, 8], [11, 12, 13], [90, 4, 61, 7, 7, 30]]
TOKENS = 24


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """(target folder, a bundle, a better bundle): K 3, float32."""
    root = tmp_path_factory.mktemp("front")
    tok = make_tokenizer()
    target = engine_llama(len(tok), 8)
    target_dir = save_model(target, tok, root / "target")
    out = []
    for name, scale in (("a", 0.05), ("b", 0.01)):
        draft = save_model(noisy_copy(target, scale=scale, seed=3), tok, root / f"draft-{name}")
        out.append(export_bundle(str(target_dir), str(draft), root / f"bundle-{name}", k=3,
                                 dtype="float32"))
    return target_dir, *out


def test_vllm_behind_the_front_answers_records_and_swaps_under_load(vllm_worker, bundles,
                                                                     tmp_path):
    target_dir, first, second = bundles
    args = ServeArgs(bundle=str(first), engine="vllm", record=str(tmp_path / "traffic"),
                     admin_token="tok", engine_python=str(vllm_worker.python),
                     engine_args="--max-model-len 256 --max-num-seqs 16",
                     engine_log_dir=str(tmp_path / "logs"))
    args.validate()
    app, desc, close = build(args)
    srv = LiveServer(app)
    try:
        assert "1 vLLM server(s)" in desc
        answers = [httpx.post(f"{srv.url}/completions", json={
            "prompt": p, "max_tokens": TOKENS, "temperature": 0, "return_token_ids": True,
            "metadata": {"domain": "code"}}, timeout=120).json() for p in PROMPTS]

        # a swap to the second bundle with 8 streams in flight when it moves them: the
        # clients start once the canary has passed (before, on 2 cores, vLLM's busy-polling
        # under load starves the new replica's start for minutes) and read slowly (a slow
        # link), so each request is still in flight on the old replica at the switch
        failures, done, stop = [], [], threading.Event()

        def stream():
            while not stop.is_set():
                try:
                    with httpx.stream("POST", f"{srv.url}/completions", json={
                            "prompt": PROMPTS[0], "max_tokens": TOKENS, "temperature": 0,
                            "stream": True}, timeout=120) as r:
                        lines = []
                        for line in r.iter_lines():
                            lines.append(line)
                            time.sleep(0.1)
                        text = "".join(lines)
                    ok = r.status_code == 200 and text.endswith("data: [DONE]") and \
                        '"error"' not in text
                    (done if ok else failures).append(text[-300:])
                except httpx.HTTPError as e:
                    failures.append(repr(e))

        threads = [threading.Thread(target=stream) for _ in range(8)]
        swapper, in_flight = app.state.admin.swapper, []
        canary = swapper.canary

        async def canary_then_load(new, old):
            verdict = await canary(new, old)
            for t in threads:
                t.start()
            for _ in range(1200):  # until all 8 decode on the old replica: up to a minute, as
                # a loaded CI machine once had 3 of them in flight after 20 s
                if old.busy >= 8:
                    break
                await asyncio.sleep(0.05)
            in_flight.append(old.busy)
            return verdict

        swapper.canary = canary_then_load
        swapped = httpx.post(f"{srv.base}/admin/draft", json={"bundle": str(second)},
                             headers={"Authorization": "Bearer tok"}, timeout=600)
        time.sleep(1.0)  # some requests on the new replica
        stop.set()
        for t in threads:
            t.join(120)
        assert swapped.status_code == 200, swapped.text
        assert in_flight == [8], (in_flight, len(done), failures[:2])
        assert not failures, failures[:2]
        assert len(done) >= 8
        said = swapped.json()
        after = httpx.post(f"{srv.url}/completions", json={
            "prompt": PROMPTS[0], "max_tokens": TOKENS, "temperature": 0}, timeout=120).json()
        # n 2: vLLM counts no steps for it; a record per choice all the same
        two = httpx.post(f"{srv.url}/completions", json={
            "prompt": PROMPTS[1], "max_tokens": 8, "n": 2, "temperature": 1.0, "seed": 5,
            "return_token_ids": True, "metadata": {"domain": "n2"}}, timeout=120).json()
    finally:
        srv.stop()
        close()
    assert said["canary"]["requests"] >= 4
    assert after["draftkit"]["draft"] == said["draft"] != said["previous"]

    # greedy through the front = draftkit's tokens; the records hold vLLM's per-step counts,
    # which are draftkit's on the same requests
    pair = load_pair(str(target_dir), str(first), device="cpu", dtype="float32")
    ours = SpeculativeEngine(pair.target, pair.draft).generate(PROMPTS, k=3,
                                                               max_new_tokens=TOKENS)
    records = read_traffic(tmp_path / "traffic")
    served = [r for r in records if r.domain == "code"]
    assert [a["choices"][0]["token_ids"] for a in answers] == [o.tokens for o in ours]
    assert [r.completion_ids for r in served] == [o.tokens for o in ours]
    assert [r.prompt_ids for r in served] == PROMPTS
    assert [r.rounds for r in served] == [o.stats.rounds for o in ours]
    assert sum(a for r in served for _, a in r.rounds) > 0, "nothing accepted: a weak test"
    assert {r.draft for r in records} == {said["draft"], said["previous"]}
    pairs = [r for r in records if r.domain == "n2"]
    assert [r.completion_ids for r in pairs] == [c["token_ids"] for c in two["choices"]]
    assert all(r.rounds is None for r in pairs) and len(pairs) == 2

    # replayed through the draft, each completion gives vLLM's own rounds
    replayer = Replayer(pair.target, pair.draft, 3)
    for r in served:
        total = len(r.prompt_ids) + len(r.completion_ids)
        assert rounds_before_end(replayer.counts(r).rounds, len(r.prompt_ids), total, 3) == \
            rounds_before_end(r.rounds, len(r.prompt_ids), total, 3)
