"""The front over vLLM (``draftkit serve --engine vllm`` / ``--upstream``), against stand-in
upstreams (tests/serve/fake_vllm.py) that answer as vLLM 0.32 does: requests passed on and
answered, what vLLM served recorded and counted as the built-in engine's is, least-busy
routing, and every way an upstream fails reaching the client as a clean OpenAI error with no
half-written record. A real vLLM behind the front: tests/engines/test_vllm_front.py."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from draftkit.errors import ConfigError
from draftkit.serve.app import create_proxy_app
from draftkit.serve.args import ServeArgs
from draftkit.serve.upstream import Pool, discover
from draftkit.serve.vllm_front import NoSwap
from draftkit.traffic.shards import read_traffic
from draftkit.traffic.recorder import Recorder
from tests.helpers import LiveServer
from tests.serve import fake_vllm


@pytest.fixture(scope="module")
def upstreams():
    """Two stand-in vLLM servers, for the module."""
    servers = [LiveServer(fake_vllm.create()) for _ in range(2)]
    yield servers
    for s in servers:
        s.stop()


@pytest.fixture
def reset(upstreams):
    for s in upstreams:
        s.app.state.mode, s.app.state.delay = "ok", 0.0
        s.app.state.bodies.clear()
        s.app.state.most = 0
    return upstreams


def front(urls, tmp_path=None, **kw):
    """A front over ``urls``, recording into tmp_path/traffic when given; (server, folder)."""
    pool = Pool([discover(u, "draft-a") for u in urls], read_timeout=kw.pop("timeout", 30.0))
    recorder = None
    if tmp_path is not None:
        recorder = Recorder(tmp_path / "traffic", target="t1", tokenizer="tok1")
        recorder.open()
    app = create_proxy_app(pool, model_name="served", vocab=fake_vllm.VOCAB, swapper=NoSwap(),
                           recorder=recorder, route_labels=("code", "math"), **kw)
    return LiveServer(app), (recorder.folder if recorder else None)


def post(srv, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(srv.base + path, json=body, timeout=30, **kw)


def sse(response: httpx.Response) -> list:
    out = []
    for line in response.text.splitlines():
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_a_completion_is_answered_recorded_and_counted_as_the_engines_are(reset, tmp_path):
    up = reset[0]
    srv, folder = front([up.base], tmp_path)
    try:
        got = post(srv, "/v1/completions", {"model": "served", "prompt": [5, 6, 7],
                                            "max_tokens": 9, "temperature": 0,
                                            "metadata": {"domain": "Code"}, "logprobs": None,
                                            "presence_penalty": 0.5})
        assert got.status_code == 200, got.text
        body = got.json()
        sent = up.app.state.bodies[-1]
        # passed on as sent, with the upstream's name and the ids asked for
        assert sent["model"] == "upstream-model" and sent["return_token_ids"] is True
        assert sent["presence_penalty"] == 0.5 and sent["metadata"] == {"domain": "Code"}
        assert body["model"] == "served"
        assert "token_ids" not in body["choices"][0] and "prompt_token_ids" not in \
            body["choices"][0], "ids the client did not ask for"
        drafted, accepted = fake_vllm.steps(9)
        assert body["draftkit"]["drafted"] == sum(drafted) and \
            body["draftkit"]["accepted"] == sum(accepted)
        assert body["draftkit"]["draft"] == "draft-a"
        assert body["draftkit"]["target_calls"] == len(drafted) + 1
        # the chat endpoint, by a labelled route, asking for the ids
        chat = post(srv, "/math/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5,
            "return_token_ids": True}).json()
        assert chat["choices"][0]["token_ids"] == fake_vllm.tokens([5, 1], 5)
        metrics = httpx.get(srv.base + "/metrics").text
    finally:
        srv.stop()
    records = read_traffic(folder)
    assert [r.domain for r in records] == ["code", "math"]
    first = records[0]
    assert first.prompt_ids == [5, 6, 7] and first.completion_ids == fake_vllm.tokens(
        [5, 6, 7], 9)
    assert first.rounds == [[d, a] for d, a in zip(drafted, accepted)]
    assert first.draft == "draft-a" and first.target == "t1" and first.tokenizer == "tok1"
    assert first.sampling.temperature == 0.0 and first.sampling.max_tokens == 9
    assert records[1].sampling.temperature == 1.0  # vLLM's default where the body sets none
    assert records[1].sampling.max_tokens == 5
    tokens = sum(fake_vllm.steps(9)[0]) + sum(fake_vllm.steps(5)[0])
    assert f'draftkit:spec_decode_num_draft_tokens_total{{engine="0",model_name="served"}} ' \
           f'{float(tokens)}' in metrics
    assert 'spec_decode_num_drafts_by_domain_total{domain="code"' in metrics
    assert 'request_success_by_draft_total{draft="draft-a"' in metrics


def test_a_stream_is_passed_on_and_recorded(reset, tmp_path):
    up = reset[0]
    srv, folder = front([up.base], tmp_path)
    try:
        plain = sse(post(srv, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": True,
            "user": "chat"}))
        sent = up.app.state.bodies[-1]
        assert sent["stream_options"] == {"include_usage": True}
        assert plain[-1] == "[DONE]" and all(c["model"] == "served" for c in plain[:-1])
        assert all(c["choices"] for c in plain[:-1]), "a usage chunk the client did not ask for"
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in plain[:-1])
        assert text == "".join(f" w{t}" for t in fake_vllm.tokens([2, 1], 6))
        assert not any("token_ids" in c["choices"][0] for c in plain[:-1])
        asked = sse(post(srv, "/v1/completions", {
            "prompt": "abc", "max_tokens": 4, "stream": True, "return_token_ids": True,
            "stream_options": {"include_usage": True}}))
        usage = asked[-2]
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4
        assert usage["draftkit"]["drafted"] == sum(fake_vllm.steps(4)[0])
        assert [t for c in asked[:-2] for t in c["choices"][0]["token_ids"]] == \
            fake_vllm.tokens([97, 98, 99], 4)
    finally:
        srv.stop()
    records = read_traffic(folder)
    assert [r.domain for r in records] == ["chat", "unlabeled"]
    assert records[0].completion_ids == fake_vllm.tokens([2, 1], 6)
    assert records[0].prompt_ids == [2, 1]
    assert records[1].rounds == [[d, a] for d, a in zip(*fake_vllm.steps(4))]


def test_requests_without_counts_are_recorded_for_replay_and_counted(reset, tmp_path):
    up = reset[0]
    srv, folder = front([up.base], tmp_path)
    try:
        assert post(srv, "/v1/completions", {"prompt": [1], "max_tokens": 3, "n": 2}
                    ).status_code == 200
        streamed = sse(post(srv, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "n": 2,
            "stream": True}))
        assert {c["choices"][0]["index"] for c in streamed[:-1]} == {0, 1}
        assert post(srv, "/v1/completions", {"prompt": [1], "max_tokens": 3, "metadata": {
            "draftkit_record": "off"}}).status_code == 200
        up.app.state.mode = "no_metrics"
        assert post(srv, "/v1/completions", {"prompt": [1], "max_tokens": 3}).json()[
            "draftkit"]["drafted"] is None
        up.app.state.mode = "ok"
        assert post(srv, "/v1/completions", {"prompt": [1], "max_tokens": 3}).status_code == 200
        metrics = httpx.get(srv.base + "/metrics").text
    finally:
        srv.stop()
    records = read_traffic(folder)
    # n 2 twice: a record per choice, without counts; no metrics: one without; ok: counted
    assert [r.rounds is None for r in records] == [True] * 5 + [False]
    assert [len(r.completion_ids) for r in records] == [3, 3, 2, 2, 3, 3]
    assert 'traffic_uncounted_total{engine="0",model_name="served",reason="n>1"} 2.0' in metrics
    assert 'traffic_uncounted_total{engine="0",model_name="served",reason="no_counts"} 1.0' \
        in metrics
    assert 'traffic_unrecorded_total{engine="0",model_name="served",reason="no_ids"} 0.0' \
        in metrics


@pytest.mark.parametrize("mode,status,says", [
    ("error500", 502, "answered 500: engine core died"),
    ("malformed", 502, "not JSON"),
])
def test_an_upstream_failure_is_a_clean_error_and_no_record(reset, tmp_path, mode, status,
                                                            says):
    up = reset[0]
    srv, folder = front([up.base], tmp_path)
    up.app.state.mode = mode
    try:
        got = post(srv, "/v1/completions", {"prompt": [1], "max_tokens": 3})
        assert got.status_code == status
        error = got.json()["error"]
        assert says in error["message"] and error["type"] == "server_error"
        assert "\n" not in error["message"]
        streamed = sse(post(srv, "/v1/completions", {"prompt": [1], "max_tokens": 3,
                                                     "stream": True}))
        assert streamed == [] or streamed[-1] == "[DONE]"
    finally:
        srv.stop()
    assert not list(folder.glob("traffic-*.jsonl")), "a failed request was recorded"


def test_a_stream_cut_midway_ends_with_an_error_event_and_no_record(reset, tmp_path):
    up = reset[0]
    srv, folder = front([up.base], tmp_path)
    up.app.state.mode = "cut"
    try:
        events = sse(post(srv, "/v1/completions", {"prompt": [1], "max_tokens": 6,
                                                   "stream": True}))
    finally:
        srv.stop()
    assert events[-1] == "[DONE]"
    assert "broke off the stream" in events[-2]["error"]["message"]
    assert sum("choices" in e for e in events[:-1]) == 2
    assert not list(folder.glob("traffic-*.jsonl"))


def test_the_clients_mistakes_come_back_in_vllms_words_with_its_status(reset):
    up = reset[0]
    srv, _ = front([up.base])
    try:
        too_long = post(srv, "/v1/completions", {"prompt": [1], "max_tokens": 100000})
        assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "max_tokens"
        streamed = post(srv, "/v1/completions", {"prompt": [1], "max_tokens": 100000,
                                                 "stream": True})
        assert streamed.status_code == 400, "a stream vLLM refused is a 400, not events"
        wrong = post(srv, "/v1/completions", {"model": "other", "prompt": [1]})
        assert wrong.status_code == 404 and "served" in wrong.json()["error"]["message"]
        assert post(srv, "/v1/completions", {"prompt": [1], "stream": "yes"}).status_code == 400
        bad = httpx.post(srv.base + "/v1/completions", content=b"{not json", timeout=10)
        assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
        assert post(srv, "/chat/v1/completions", {"prompt": [1]}).status_code == 404
    finally:
        srv.stop()


def test_requests_go_to_the_least_busy_upstream_and_around_a_dead_one(reset):
    a, b = reset
    a.app.state.delay = 1.5  # a holds its requests: the next ones go to b
    srv, _ = front([a.base, b.base])
    try:
        results = []

        def ask():
            results.append(post(srv, "/v1/completions", {"prompt": [1], "max_tokens": 2}))

        slow = threading.Thread(target=ask)
        slow.start()
        time.sleep(0.5)
        for _ in range(3):
            ask()
        slow.join()
        assert all(r.status_code == 200 for r in results)
        assert len(a.app.state.bodies) == 1 and len(b.app.state.bodies) == 3
    finally:
        srv.stop()
    # an upstream that refuses connections: routed around; none left: 503, /health says so
    dead = "http://127.0.0.1:9"
    pool = Pool([discover(b.base, "d"), discover(b.base, "d")], read_timeout=10)
    pool.upstreams[0].url = dead
    app = create_proxy_app(pool, model_name="served", vocab=fake_vllm.VOCAB, swapper=NoSwap())
    srv = LiveServer(app)
    try:
        for _ in range(3):
            assert post(srv, "/v1/completions", {"prompt": [1], "max_tokens": 2}
                        ).status_code == 200
        assert not pool.upstreams[0].healthy and pool.upstreams[1].healthy
        pool.upstreams[1].url = dead
        pool.upstreams[1].healthy = True
        gone = post(srv, "/v1/completions", {"prompt": [1], "max_tokens": 2})
        assert gone.status_code == 503 and "no vLLM server" in gone.json()["error"]["message"]
        assert httpx.get(srv.base + "/health").status_code == 503
    finally:
        srv.stop()


def test_a_swap_behind_servers_the_front_did_not_start_is_refused(reset):
    srv, _ = front([reset[0].base], admin_token="tok")
    try:
        got = httpx.post(srv.base + "/admin/draft", json={"bundle": "/x"},
                         headers={"Authorization": "Bearer tok"}, timeout=10)
        assert got.status_code == 409 and "--upstream" in got.json()["error"]["message"]
        assert httpx.post(srv.base + "/admin/draft", json={"bundle": "/x"}).status_code == 401
        models = httpx.get(srv.base + "/v1/models").json()["data"][0]
        assert models["id"] == "served" and models["max_model_len"] == 256
    finally:
        srv.stop()


def test_an_upstream_that_is_not_vllm_is_refused_at_start():
    from draftkit.errors import DraftkitError

    with pytest.raises(DraftkitError, match="does not answer GET /v1/models"):
        discover("http://127.0.0.1:9", "d", timeout=2)
    with pytest.raises(DraftkitError, match="not an http"):
        discover("ftp://x", "d")


@pytest.mark.parametrize("flags,says", [
    (dict(engine="vllm", k="3"), "--k is for draftkit's own engine"),
    (dict(engine="vllm", max_batch=4), "--max-batch is for draftkit's own engine"),
    (dict(engine="vllm", verify="block"), "--verify is for draftkit's own engine"),
    (dict(replicas=2), "--replicas is for --engine vllm"),
    (dict(upstream=["http://x:1"], replicas=2), "--replicas is for vLLM servers the front"),
    (dict(engine="vllm", engine_args="--port 9"), "--engine-args --port: the front sets it"),
    (dict(engine="vllm", engine_args="'--x"), "does not split"),
    (dict(engine="vllm", tensor_parallel_size=0), "--tensor-parallel-size must be >= 1"),
    (dict(vllm_cpu_fix="off"), "--vllm-cpu-fix is for --engine vllm"),
])
def test_the_fronts_flags_are_checked_in_one_line(flags, says):
    with pytest.raises(ConfigError, match=says):
        ServeArgs(bundle="b", **flags).validate()


# --- blue/green, over stand-in upstreams --------------------------------------------------------

class Greens:
    """R.start and R.wait_ready stood in for: each new replica is a stand-in vLLM (``mode``,
    ``delay`` as given) and a harmless process the swap may stop."""

    def __init__(self, delay: float = 0.0):
        self.servers, self.delay = [], delay

    def start(self, launch, bundle, place, index):
        import subprocess

        from draftkit.serve.replicas import Replica

        server = LiveServer(fake_vllm.create())
        server.app.state.delay = self.delay
        self.servers.append(server)
        process = subprocess.Popen(["sleep", "120"], start_new_session=True)
        return Replica(process, server.base, tmp_log(), bundle)


def tmp_log():
    import tempfile
    from pathlib import Path

    return Path(tempfile.mkstemp(suffix=".log")[1])


def blue_green(monkeypatch, old_servers, tmp_path, greens: Greens, identity="draft-b"):
    """A front whose swapper is BlueGreen over ``old_servers`` (replicas it "started")."""
    import subprocess
    import sys
    from pathlib import Path

    from draftkit.serve import replicas as R
    from draftkit.serve.vllm_swap import BlueGreen

    monkeypatch.setattr(R, "start", greens.start)
    monkeypatch.setattr(R, "wait_ready", lambda replicas, *a, **k: None)
    old = [R.Replica(subprocess.Popen(["sleep", "120"], start_new_session=True), s.base,
                     tmp_log(), "old") for s in old_servers]
    launch = R.Launch(Path(sys.executable), "0.32.0+cpu", "served")
    swapper = BlueGreen(launch, old, [{} for _ in old], "target")
    monkeypatch.setattr(swapper, "check", lambda bundle, previous: identity)
    pool = Pool([discover(s.base, "draft-a") for s in old_servers], read_timeout=30)
    recorder = Recorder(tmp_path / "traffic", target="t1", tokenizer="tok1")
    recorder.open()
    app = create_proxy_app(pool, model_name="served", vocab=fake_vllm.VOCAB, swapper=swapper,
                           recorder=recorder, admin_token="tok")
    return LiveServer(app), swapper, old


def recorded(folder, at_least: int = 1, within: float = 20.0) -> None:
    """Wait until the recorder's writer thread has put ``at_least`` requests on disk (a loaded
    machine may take a while)."""
    from draftkit.errors import DraftkitError
    from draftkit.traffic.shards import read_traffic

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if len(read_traffic(folder)) >= at_least:
                return
        except DraftkitError:  # no shard yet
            pass
        time.sleep(0.05)
    raise AssertionError(f"nothing recorded in {folder} within {within} s")


def swap(srv, bundle="new-bundle") -> httpx.Response:
    return httpx.post(srv.base + "/admin/draft", json={"bundle": bundle},
                      headers={"Authorization": "Bearer tok"}, timeout=60)


def test_blue_green_moves_new_requests_to_the_new_draft_and_drains_the_old(
        reset, tmp_path, monkeypatch):
    old = reset[0]
    old.app.state.delay = 0.3  # requests in flight while the swap happens
    greens = Greens()
    srv, swapper, old_replicas = blue_green(monkeypatch, [old], tmp_path, greens)
    try:
        results, stop = [], threading.Event()

        def client():
            while not stop.is_set():
                results.append(post(srv, "/v1/completions", {"prompt": [3, 4], "max_tokens": 4,
                                                             "stream": True}))

        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        recorded(tmp_path / "traffic")  # the canary decodes what is on disk: wait for some
        answer = swap(srv)
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join()
        assert answer.status_code == 200, answer.text
        said = answer.json()
        assert said["draft"] == "draft-b" and said["previous"] == "draft-a"
        assert said["canary"]["requests"] >= 1 and said["canary"]["verdict"] == "within noise"
        assert all(r.status_code == 200 and sse(r)[-1] == "[DONE]" for r in results)
        assert not any("error" in e for r in results for e in sse(r)[:-1] if e != "[DONE]")
        assert old_replicas[0].process.poll() is not None, "the old replica was not stopped"
        assert [r.url for r in swapper.replicas] == [greens.servers[0].base]
        after = post(srv, "/v1/completions", {"prompt": [3], "max_tokens": 2}).json()
        assert after["draftkit"]["draft"] == "draft-b"
        info = httpx.get(srv.base + "/metrics").text
        assert 'draft_info{draft="draft-b",engine="0",model_name="served"} 1.0' in info
    finally:
        srv.stop()
        for s in greens.servers:
            s.stop()
        from draftkit.serve import replicas as R

        R.stop_all(swapper.replicas + old_replicas)
    drafts = {r.draft for r in read_traffic(tmp_path / "traffic")}
    assert drafts == {"draft-a", "draft-b"}


def test_on_gpus_each_swap_starts_the_new_replicas_on_the_gpus_left_spare(
        reset, tmp_path, monkeypatch):
    """Replica on GPU 0, GPUs 0-2 visible: the first swap's new replica goes to GPU 1 and the
    second's to GPU 0 (the one the first swap freed), never to GPU 1, which serves then."""
    from draftkit.serve import replicas as R

    greens, placed = Greens(), []
    start = greens.start
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    srv, swapper, old_replicas = blue_green(monkeypatch, [reset[0]], tmp_path, greens)
    monkeypatch.setattr(R, "start", lambda launch, bundle, place, i: (
        placed.append(place["CUDA_VISIBLE_DEVICES"]), start(launch, bundle, place, i))[1])
    swapper.launch = R.Launch(swapper.launch.python, "0.32.0", "served")  # a CUDA build
    swapper.places = [{"CUDA_VISIBLE_DEVICES": "0"}]
    try:
        assert swap(srv).status_code == 200
        assert swap(srv, "newer-bundle").status_code == 200
        assert placed == ["1", "0"]
    finally:
        srv.stop()
        for s in greens.servers:
            s.stop()
        R.stop_all(swapper.replicas + old_replicas)


def test_a_bundle_that_fails_its_canary_leaves_the_old_draft_serving(
        reset, tmp_path, monkeypatch):
    old = reset[0]

    class WorseGreens(Greens):
        def start(self, *a):
            replica = super().start(*a)
            self.servers[-1].app.state.mode = "worse"
            return replica

    greens = WorseGreens()
    srv, swapper, old_replicas = blue_green(monkeypatch, [old], tmp_path, greens)
    try:
        for i in range(6):  # recorded traffic: the canary's requests
            assert post(srv, "/v1/completions", {"prompt": [i, 2], "max_tokens": 12}
                        ).status_code == 200
        recorded(tmp_path / "traffic", at_least=6)
        answer = swap(srv)
        assert answer.status_code == 422, answer.text
        error = answer.json()["error"]
        assert error["code"] == "canary_failed" and "draft draft-a serves on" in error["message"]
        assert greens.servers and swapper.replicas == old_replicas
        assert old_replicas[0].process.poll() is None, "the serving replica was stopped"
        assert post(srv, "/v1/completions", {"prompt": [3], "max_tokens": 2}).json()[
            "draftkit"]["draft"] == "draft-a"
    finally:
        srv.stop()
        for s in greens.servers:
            s.stop()
        from draftkit.serve import replicas as R

        R.stop_all(swapper.replicas + old_replicas)


def test_a_record_says_the_sampling_vllm_applied_where_the_request_set_none(tmp_path):
    from draftkit.traffic.vllm_sampling import DEFAULTS, sampling_defaults

    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.6, "top_p": 0.9, "eos_token_id": 2}))
    # vLLM's default (--generation-config auto) takes the model's, over its own
    assert sampling_defaults(tmp_path) == {"temperature": 0.6, "top_p": 0.9, "top_k": 0}
    assert sampling_defaults(tmp_path, ("--generation-config", "vllm")) == DEFAULTS
    assert sampling_defaults(tmp_path / "none") == DEFAULTS


# --- starting vLLM -------------------------------------------------------------------------------

def test_replicas_get_their_own_gpus_or_cores(monkeypatch):
    from draftkit.engines.vllm import EngineError
    from draftkit.serve.replicas import placements

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,5")
    assert placements(2, 2, cpu=False) == [{"CUDA_VISIBLE_DEVICES": "0,1"},
                                           {"CUDA_VISIBLE_DEVICES": "2,3"}]
    with pytest.raises(EngineError, match="need 6 GPUs; 5 are visible"):
        placements(3, 2, cpu=False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    assert placements(2, 2, cpu=True) == [{"VLLM_CPU_OMP_THREADS_BIND": "0-1|2-3"},
                                          {"VLLM_CPU_OMP_THREADS_BIND": "4-5|6-7"}]
    assert placements(8, 1, cpu=True)[7] == {"VLLM_CPU_OMP_THREADS_BIND": "7"}
    with pytest.raises(EngineError, match="need 9 CPU cores"):
        placements(9, 1, cpu=True)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # the user's own binding wins
    assert placements(2, 1, cpu=True) == [{}, {}]


def test_a_replica_runs_the_bundles_preflight_command_with_the_fronts_flags(tiny_dirs,
                                                                            tmp_path):
    import sys
    from pathlib import Path

    from draftkit.engines.vllm import EngineError
    from draftkit.export import export_bundle
    from draftkit.serve.replicas import Launch

    target, draft = tiny_dirs
    bundle = export_bundle(str(target), str(draft), tmp_path / "b", k=2)
    python = Path(sys.executable)
    cpu = Launch(python, "0.32.0+cpu", "served", engine_args=("--max-num-seqs", "8"))
    argv = cpu.command(str(bundle), 9001)
    assert argv[:5] == [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model",
                        str(Path(target).resolve())]
    for flag in (["--port", "9001"], ["--served-model-name", "served"],
                 ["--per-request-spec-decode-metrics", "detailed"], ["--max-num-seqs", "8"]):
        i = argv.index(flag[0])
        assert argv[i:i + 2] == flag
    assert "--enforce-eager" in argv and json.loads(
        argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"] == 2
    gpu = Launch(python, "0.32.0", "served").command(str(bundle), 9001)
    assert gpu[1] == "serve" and "--enforce-eager" not in gpu
    with pytest.raises(EngineError, match="preflight refused to start vLLM: vLLM 0.14.0 is "
                                          "older than this bundle needs"):
        Launch(python, "0.14.0", "served").command(str(bundle), 9001)


def test_a_record_says_how_its_server_chose_drafts():
    """A replica's rule is its speculative config's draft_sample_method, else vLLM's greedy
    default; a server the front did not start records it as not known."""
    from draftkit.serve.replicas import draft_sample_method

    spec = json.dumps({"method": "eagle3", "draft_sample_method": "probabilistic"})
    assert draft_sample_method(["python", "--speculative-config", spec]) == "probabilistic"
    assert draft_sample_method(["vllm", "serve", "m", "--speculative-config",
                                json.dumps({"method": "eagle3"})]) == "greedy"
    assert draft_sample_method(["vllm", "serve", "m"]) == "greedy"


def test_records_carry_the_upstreams_draft_rule(reset, tmp_path):
    up = reset[0]
    srv, folder = front([up.base], tmp_path)
    srv.app.state.completions.pool.upstreams[0].draft_sample_method = "greedy"
    try:
        assert post(srv, "/v1/completions", {"prompt": [1], "max_tokens": 3}).status_code == 200
    finally:
        srv.stop()
    (record,) = read_traffic(folder)
    assert record.sampling.draft_sample_method == "greedy"
    srv, folder = front([up.base], tmp_path / "b")  # --upstream: not known
    try:
        assert post(srv, "/v1/completions", {"prompt": [1], "max_tokens": 3}).status_code == 200
    finally:
        srv.stop()
    assert read_traffic(folder)[0].sampling.draft_sample_method is None
