"""``POST /admin/draft``: a running server takes a new bundle's draft without a restart, on
real bundles of tiny models (``draftkit export``), served as ``draftkit serve`` builds them."""

import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest

from draftkit.export import export_bundle
from draftkit.models.resolve import model_identity, resolve_model
from draftkit.serve.args import ServeArgs
from draftkit.serve.command import build
from tests.helpers import LiveServer, make_llama, make_tokenizer, noisy_copy, save_model

TOKEN = "s3cret-token"
WORDS = ["hello world", "the sum of two", "write python code", "what is the answer",
         "a poem about water", "translate this story"]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """Bundles a and b: two drafts (noisy copies) of one target; foreign: b's draft exported
    for another target of the same shape and tokenizer. -> dict of paths and identities."""
    root = tmp_path_factory.mktemp("swap")
    tok = make_tokenizer()
    target = make_llama(len(tok), num_layers=3, seed=0)
    dirs = {name: save_model(model, tok, root / name) for name, model in (
        ("target", target), ("draft_a", noisy_copy(target)),
        ("draft_b", noisy_copy(target, seed=8)),
        ("other", make_llama(len(tok), num_layers=3, seed=1)))}
    out = {"target": dirs["target"]}
    for name, t, d in (("a", "target", "draft_a"), ("b", "target", "draft_b"),
                       ("foreign", "other", "draft_b")):
        out[name] = export_bundle(str(dirs[t]), str(dirs[d]), root / name, k=2,
                                  dtype="float32")
    out["id_a"], out["id_b"] = (model_identity(resolve_model(str(out[n]), "draft"))
                                for n in ("a", "b"))
    assert out["id_a"] != out["id_b"]
    return out


def serve(bundle, monkeypatch, **kw) -> LiveServer:
    monkeypatch.delenv("DRAFTKIT_ADMIN_TOKEN", raising=False)
    kw = {"admin_token": TOKEN, "k": 2, **kw}
    app, _, _ = build(ServeArgs(bundle=str(bundle), max_batch=8, max_tokens_limit=64,
                             device="cpu", served_model_name="tiny", **kw))
    return LiveServer(app)


def swap(srv, bundle, token=TOKEN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{srv.base}/admin/draft", json={"bundle": str(bundle)},
                      headers=headers, timeout=60)


def complete(srv, prompt, stream=False, max_tokens=12) -> dict:
    """A greedy completion over plain HTTP: its text and its ``draftkit`` stats."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": stream}
    if not stream:
        r = httpx.post(f"{srv.url}/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        out = r.json()
        return {"text": out["choices"][0]["text"], "draftkit": out["draftkit"]}
    import json

    text, spec, lines = "", None, []
    with httpx.stream("POST", f"{srv.url}/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]", lines
    for line in lines[:-1]:
        chunk = json.loads(line.removeprefix("data: "))
        assert "error" not in chunk, chunk
        text += chunk["choices"][0]["text"]
        spec = chunk.get("draftkit", spec)
    return {"text": text, "draftkit": spec}


def series(srv, name: str) -> dict[str, float]:
    """draft label -> value, summed over the other labels."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{srv.base}/metrics").text.splitlines():
        if line.startswith(name + "{"):
            draft = line.split('draft="', 1)[1].split('"', 1)[0]
            out[draft] = out.get(draft, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def one_line_error(r: httpx.Response, status: int, *phrases: str) -> str:
    assert r.status_code == status, r.text
    message = r.json()["error"]["message"]
    assert "\n" not in message and all(p in message for p in phrases), message
    return message


def test_the_endpoint_is_off_without_a_token_and_refuses_a_wrong_one(bundles, monkeypatch,
                                                                     tiny_models):
    off = serve(bundles["a"], monkeypatch, admin_token=None)
    try:
        one_line_error(swap(off, bundles["b"]), 403, "admin endpoint is off", "--admin-token")
    finally:
        off.stop()
    srv = serve(bundles["a"], monkeypatch)
    try:
        for token in (None, "wrong", TOKEN + "x"):
            r = swap(srv, bundles["b"], token)
            one_line_error(r, 401, "admin token")
            assert r.headers["www-authenticate"] == "Bearer"
        r = httpx.post(f"{srv.base}/admin/draft", json={"bundle": str(bundles["b"])},
                       headers={"Authorization": f"Basic {TOKEN}"})
        one_line_error(r, 401)
        assert series(srv, "draftkit:draft_info") == {bundles["id_a"]: 1.0}
    finally:
        srv.stop()


def test_refused_bundles_leave_the_old_draft_serving(bundles, monkeypatch, tmp_path):
    tampered = shutil.copytree(bundles["b"], tmp_path / "tampered")
    config = tampered / "draft" / "config.json"
    config.write_text(config.read_text().replace('"num_hidden_layers": 3',
                                                 '"num_hidden_layers": 2'))
    srv = serve(bundles["a"], monkeypatch)
    serving = f"draft {bundles['id_a']} serves on"
    try:
        one_line_error(swap(srv, bundles["foreign"]), 422, serving,
                       "is not the one this bundle was exported for")
        one_line_error(swap(srv, tampered), 422, serving, "draft/config.json does not match "
                                                          "its sha256")
        one_line_error(swap(srv, bundles["target"]), 422, serving, "is not a draftkit bundle")
        one_line_error(swap(srv, tmp_path / "nowhere"), 422, serving, "does not exist")
        said = one_line_error(swap(srv, "~/nowhere"), 422, "~/nowhere does not exist")
        assert str(Path.home()) + "/" not in said  # a path the client did not send
        for body in ({}, {"bundle": 3}, []):
            r = httpx.post(f"{srv.base}/admin/draft", json=body,
                           headers={"Authorization": f"Bearer {TOKEN}"})
            one_line_error(r, 400, '{"bundle":')
        assert series(srv, "draftkit:draft_info") == {bundles["id_a"]: 1.0}
        assert complete(srv, "hello world")["draftkit"]["draft"] == bundles["id_a"]
        assert srv.scheduler.engine.draft is not None and not srv.app.state.admin.busy
    finally:
        srv.stop()


def test_a_server_without_a_draft_refuses_a_swap(bundles, monkeypatch):
    srv = serve(bundles["a"], monkeypatch, draft="none")
    try:
        one_line_error(swap(srv, bundles["b"]), 409, "decodes without a draft")
        assert complete(srv, "hello world")["draftkit"]["draft"] == "none"
    finally:
        srv.stop()


def test_a_draft_that_fails_to_come_in_leaves_the_old_one_serving(bundles, monkeypatch):
    """The new batch fails to open (out of memory, say): a 500, the old draft serves on, with
    the K policy it had learnt; the next swap goes through, and under --k auto the policy
    starts afresh for the new draft."""
    srv = serve(bundles["a"], monkeypatch, k="auto", k_max=3)
    sched, engine, id_a, id_b = srv.scheduler, srv.scheduler.engine, bundles["id_a"], \
        bundles["id_b"]
    old_model, policy, real_open, calls = engine.draft_model, sched.k_choice.policy, \
        engine.open, []

    def open_failing_once(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise RuntimeError("CUDA out of memory (simulated)")
        return real_open(*args, **kwargs)

    try:
        engine.open = open_failing_once
        one_line_error(swap(srv, bundles["b"]), 500, "CUDA out of memory",
                       f"draft {id_a} serves on")
        assert len(calls) == 2 and engine.draft_model is old_model
        assert sched.k_choice.policy is policy and sched.draft == id_a
        assert complete(srv, "hello world")["draftkit"]["draft"] == id_a
        assert series(srv, "draftkit:draft_info") == {id_a: 1.0}
        del engine.open
        r = swap(srv, bundles["b"])
        assert r.status_code == 200 and r.json()["draft"] == id_b, r.text
        assert sched.k_choice.policy is not None and sched.k_choice.policy is not policy
        assert sched.k_choice.k_max == 3
        assert complete(srv, "hello world")["draftkit"]["draft"] == id_b
    finally:
        srv.stop()


def test_a_swap_under_load(bundles, monkeypatch):
    """Six requests (streaming and not) are decoding when the swap comes: they finish on
    draft a, the swap answers after them, a second swap meanwhile is a 409, requests that
    arrive meanwhile wait and run on b, as do later ones; none fails, greedy text is the same
    on either draft, and /metrics shows both identities."""
    srv = serve(bundles["a"], monkeypatch)
    sched, id_a, id_b = srv.scheduler, bundles["id_a"], bundles["id_b"]
    hold = threading.Event()
    real_round = sched._round

    def held_round():  # the rows admitted stay in flight until the test lets them decode
        if hold.is_set():
            return real_round()
        time.sleep(0.005)

    sched._round = held_round
    results: dict[int, dict] = {}

    def send(i: int, prompt: str):
        def go():
            results[i] = complete(srv, prompt, stream=i % 2 == 0, max_tokens=16)
        t = threading.Thread(target=go)
        t.start()
        return t

    def wait_for(condition, what: str):
        deadline = time.time() + 30
        while not condition():
            assert time.time() < deadline, f"timed out waiting for {what}"
            time.sleep(0.01)

    try:
        threads = [send(i, WORDS[i]) for i in range(6)]
        wait_for(lambda: sched.running == 6, "six requests in flight")
        answer: dict = {}
        swapper = threading.Thread(target=lambda: answer.update(r=swap(srv, bundles["b"])))
        swapper.start()
        wait_for(lambda: sched.pending is not None, "the checked draft to reach the scheduler")
        one_line_error(swap(srv, bundles["a"]), 409, "in progress")
        threads += [send(6 + i, WORDS[i]) for i in range(2)]  # wait in the queue
        wait_for(lambda: len(sched.waiting) == 2, "two requests queued behind the swap")
        assert sched.running == 6 and sched.draft == id_a
        hold.set()
        swapper.join(60)
        assert answer["r"].status_code == 200, answer["r"].text
        assert answer["r"].json()["draft"] == id_b and answer["r"].json()["previous"] == id_a
        threads += [send(8 + i, WORDS[2 + i]) for i in range(2)]
        for t in threads:
            t.join(60)
        assert sorted(results) == list(range(10)), "a request failed"
        drafts = [results[i]["draftkit"]["draft"] for i in range(10)]
        assert drafts == [id_a] * 6 + [id_b] * 4
        same = [(6, 0), (7, 1), (8, 2), (9, 3)]  # greedy decoding is lossless on either draft
        assert all(results[i]["text"] == results[j]["text"] for i, j in same)
        assert series(srv, "draftkit:draft_info") == {id_a: 0.0, id_b: 1.0}
        assert series(srv, "draftkit:request_success_by_draft_total") == {id_a: 6.0,
                                                                          id_b: 4.0}
        assert not srv.app.state.admin.busy
    finally:
        hold.set()
        srv.stop()


def test_an_edit_in_place_and_a_forgery_are_refused_at_every_swap(bundles, monkeypatch,
                                                                   tmp_path):
    """A swap verifies content every time: the head of a bundle swapped in once and edited in
    place since (its size and mtime kept) is refused when swapped to again. A server that
    trusts a key refuses a bundle resealed and signed by another one (issue 65)."""
    import os

    from draftkit.signing_args import KEY_ENV, set_trusted
    from tests.helpers import forge

    b = shutil.copytree(bundles["b"], tmp_path / "b")
    weights = b / "draft" / "model.safetensors"
    srv = serve(bundles["a"], monkeypatch)
    try:
        assert swap(srv, b).status_code == 200 and swap(srv, bundles["a"]).status_code == 200
        before = weights.stat()
        with open(weights, "r+b") as f:  # a weight zeroed in place, size and mtime kept
            f.seek(before.st_size - 64)
            f.write(bytes(64))
        os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
        one_line_error(swap(srv, b), 422, "draft/model.safetensors does not match its sha256")
    finally:
        srv.stop()

    forge(b, tmp_path / "forger")  # the edit, resealed and signed by another key
    set_trusted([os.environ[KEY_ENV].replace("draftkit.key", "draftkit.pub")])
    srv = serve(bundles["a"], monkeypatch)
    try:
        one_line_error(swap(srv, b), 422, f"draft {bundles['id_a']} serves on",
                       "which no trusted key matches")
        assert swap(srv, bundles["b"]).status_code == 200  # the team's own bundle is taken
    finally:
        srv.stop()
