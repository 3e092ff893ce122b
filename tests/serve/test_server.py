"""The HTTP server end to end on tiny models, through the official ``openai`` client."""

import json
import threading
import time

import httpx
import pytest

from tests.serve.conftest import start_server

WORDS = ["hello world", "the sum of two", "write python code", "what is the answer",
         "a poem about water", "translate this story", "how many people", "first day of time"]


def offline(tiny_models, prompts_ids, n):
    """Plain decoding (K = 0), one prompt at a time: the reference for greedy outputs."""
    from draftkit.decode.engine import SpeculativeEngine

    _, target, draft = tiny_models
    engine = SpeculativeEngine(target, draft)
    return [engine.generate([p], k=0, max_new_tokens=n)[0] for p in prompts_ids]


def metric(base: str, name: str, **labels) -> float:
    total = 0.0
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_completion_and_chat(server):
    c = server.client()
    r = c.completions.create(model="tiny", prompt="hello world", max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop") and r.object == "text_completion"
    assert r.usage.prompt_tokens == 2 and r.usage.total_tokens == 2 + r.usage.completion_tokens
    spec = r.model_extra["draftkit"]
    assert set(spec) >= {"drafted", "accepted", "tau", "k"} and spec["k"] in (0, 2)
    r = c.chat.completions.create(model="tiny", messages=[
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}],
        max_tokens=10, temperature=0, seed=3, user="u1", n=1, presence_penalty=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.usage.completion_tokens <= 10 and r.model_extra["draftkit"]["tau"] >= 1.0


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_streaming_equals_plain(server, chat):
    c = server.client()
    kw = dict(model="tiny", max_tokens=12, temperature=0)
    if chat:
        msgs = [{"role": "user", "content": "write code"}]
        whole = c.chat.completions.create(messages=msgs, **kw)
        chunks = list(c.chat.completions.create(messages=msgs, stream=True,
                                                stream_options={"include_usage": True}, **kw))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        expected = whole.choices[0].message.content
    else:
        whole = c.completions.create(prompt="the sum of", **kw)
        chunks = list(c.completions.create(prompt="the sum of", stream=True,
                                           stream_options={"include_usage": True}, **kw))
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        expected = whole.choices[0].text
    assert text == expected and len(chunks) >= 3
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.model_extra["draftkit"]["drafted"] >= 0
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason


def test_raw_sse_ends_with_done(server):
    with httpx.stream("POST", f"{server.url}/completions", json={
            "model": "tiny", "prompt": "hello", "max_tokens": 4, "stream": True}) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]" and all(ln.startswith("data: ") for ln in lines)
    final = json.loads(lines[-2][6:])
    assert final["usage"]["completion_tokens"] >= 1  # usage even without include_usage


def test_concurrent_greedy_equals_offline(tiny_models):
    """32 concurrent requests on 16 slots under --k auto: every output is token for token
    what plain decoding of that prompt alone gives."""
    tok = tiny_models[0]
    srv = start_server(tiny_models, k="auto", k_max=4, max_batch=16)
    try:
        c = srv.client()
        prompts = [f"{WORDS[i % 8]} {i % 10}" for i in range(32)]
        budgets = [6 + (i * 7) % 20 for i in range(32)]
        out: list = [None] * 32

        def go(i):
            out[i] = c.completions.create(model="tiny", prompt=prompts[i], temperature=0,
                                          max_tokens=budgets[i])

        threads = [threading.Thread(target=go, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        ids = [tok(p)["input_ids"] for p in prompts]
        for i, ref in enumerate(offline(tiny_models, ids, max(budgets))):
            toks = ref.tokens[:budgets[i]]
            if tok.eos_token_id in toks:
                toks = toks[:toks.index(tok.eos_token_id) + 1]
            assert out[i].usage.completion_tokens == len(toks), i
            assert out[i].choices[0].text == tok.decode(toks, skip_special_tokens=True), i
        assert metric(srv.base, "draftkit:request_success_total") == 32
    finally:
        srv.stop()


def test_stop_strings_are_cut(server):
    c = server.client()
    full = c.completions.create(model="tiny", prompt="what is", max_tokens=12, temperature=0)
    words = full.choices[0].text.split()
    stop = " " + words[3]
    r = c.completions.create(model="tiny", prompt="what is", max_tokens=12, temperature=0,
                             stop=[stop, "never-seen"])
    assert r.choices[0].text == full.choices[0].text[:full.choices[0].text.find(stop)]
    assert r.choices[0].finish_reason == "stop"
    s = list(c.completions.create(model="tiny", prompt="what is", max_tokens=12, temperature=0,
                                  stop=stop, stream=True))
    assert "".join(ch.choices[0].text for ch in s if ch.choices) == r.choices[0].text


def test_seeded_sampling_is_reproducible(server):
    c = server.client()
    kw = dict(model="tiny", prompt="a poem about", max_tokens=16, temperature=1.0, top_p=0.9)
    a = c.completions.create(seed=11, **kw).choices[0].text
    box = []
    noise = [threading.Thread(target=lambda: box.append(c.completions.create(
        model="tiny", prompt="the answer", max_tokens=20, temperature=0.7))) for _ in range(3)]
    for t in noise:
        t.start()
    b = c.completions.create(seed=11, **kw).choices[0].text  # now in a busier batch
    for t in noise:
        t.join()
    others = {c.completions.create(seed=s, **kw).choices[0].text for s in (12, 13, 14)}
    assert a == b and len(others | {a}) > 1


@pytest.mark.parametrize("body,param", [
    (b'{"model": "tiny", "prompt": "hi",', None),
    ({"model": "tiny", "prompt": "hi", "bogus": 1}, "bogus"),
    ({"model": "tiny", "prompt": "hi", "max_tokens": -3}, "max_tokens"),
    ({"model": "tiny", "prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"model": "tiny", "prompt": "hi", "temperature": -1}, "temperature"),
    ({"model": "tiny", "prompt": "hi", "top_p": 0}, "top_p"),
    ({"model": "tiny", "prompt": "hi", "n": 2}, "n"),
    ({"model": "tiny", "prompt": "hi", "max_tokens": 65}, "max_tokens"),
    ({"model": "tiny", "prompt": "hello " * 260}, "prompt"),
    ({"model": "tiny", "prompt": "hello " * 200, "max_tokens": 60}, "max_tokens"),
    ({"model": "gpt-4", "prompt": "hi"}, "model"),
    ({"model": "tiny", "prompt": "hi", "frequency_penalty": 0.5}, "frequency_penalty"),
    ({"model": "tiny", "prompt": "hi", "seed": 2**64}, "seed"),
    ({"model": "tiny", "prompt": "hi", "stream": "yes"}, "stream"),
    ({"model": "tiny", "prompt": "hi", "max_tokens": "4"}, "max_tokens"),
    ({"model": "tiny", "prompt": "hi", "max_tokens": True}, "max_tokens"),
], ids=["json", "unknown-field", "negative-max-tokens", "zero-max-tokens", "temperature",
        "top-p", "n", "over-limit", "overlong-prompt", "prompt-plus-output", "model",
        "penalty", "seed-beyond-64-bits", "string-bool", "string-int", "bool-int"])
def test_bad_requests_are_400_with_openai_body(server, body, param):
    kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(
        body, bytes) else {"json": body}
    r = httpx.post(f"{server.url}/completions", **kw)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] is None and err["message"]
    assert err["param"] == param


def test_bad_chat_and_body_limit(server):
    r = httpx.post(f"{server.url}/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi", "extra": 1}]})
    assert r.status_code == 400 and "extra" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/chat/completions", json={"model": "tiny", "messages": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = httpx.post(f"{server.url}/completions", json={"model": "tiny", "prompt": "x" * (2 << 20)})
    assert r.status_code == 413 and "error" in r.json()


def test_unknown_routes_get_the_openai_error_body(server):
    for r, status in ((httpx.get(f"{server.url}/nothing"), 404),
                      (httpx.get(f"{server.url}/completions"), 405)):
        assert r.status_code == status and r.json()["error"]["message"], r.text


def test_models_health_metrics(server):
    c = server.client()
    assert [m.id for m in c.models.list().data] == ["tiny"]
    # max_model_len is what a request may use: prompt + max_tokens up to it, and no more
    usable = httpx.get(f"{server.url}/models").json()["data"][0]["max_model_len"]
    fits = {"model": "tiny", "prompt": [5] * (usable - 10), "max_tokens": 10, "temperature": 0}
    assert httpx.post(f"{server.url}/completions", json=fits).status_code == 200
    r = httpx.post(f"{server.url}/completions", json=dict(fits, max_tokens=11))
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    assert httpx.get(f"{server.base}/health").json() == {"status": "ok"}
    c.completions.create(model="tiny", prompt="hello", max_tokens=8, temperature=0)
    text = httpx.get(f"{server.base}/metrics").text
    for name in ("draftkit:spec_decode_num_drafts_total", "draftkit:spec_decode_num_draft_tokens"
                 "_total", "draftkit:spec_decode_num_accepted_tokens_total",
                 "draftkit:spec_decode_num_accepted_tokens_per_pos_total", "draftkit:spec_decode_k",
                 "draftkit:prompt_tokens_total", "draftkit:generation_tokens_total",
                 "draftkit:request_success_total", "draftkit:e2e_request_latency_seconds_bucket",
                 "draftkit:num_requests_running"):
        assert name in text, name
    assert metric(server.base, "draftkit:spec_decode_num_draft_tokens_total") > 0
    assert metric(server.base, "draftkit:spec_decode_num_accepted_tokens_per_pos_total",
                  position="1") >= 0
    assert 'position="0"' in text


def test_client_gone_mid_stream_frees_its_slot(tiny_models):
    """Close a stream after two chunks: the row is aborted and its slot freed at the next
    round, and the server keeps serving. Rounds are slowed so the row cannot finish first."""
    from draftkit.decode.engine import SpeculativeEngine
    from draftkit.serve.app import create_app
    from tests.serve.conftest import LiveServer

    tok, target, draft = tiny_models
    engine = SpeculativeEngine(target, draft, eos_token_id=None)  # never stops by itself
    step = engine.step

    def slow_step(state, k):
        time.sleep(0.01)
        return step(state, k)

    engine.step = slow_step
    srv = LiveServer(create_app(engine, tok, model_name="tiny", k=2, max_batch=2))
    try:
        c = srv.client()
        stream = c.completions.create(model="tiny", prompt="hello", max_tokens=200,
                                      stream=True)
        for i, _ in enumerate(stream):
            if i == 1:
                break
        assert srv.scheduler.running == 1
        stream.close()
        deadline = time.time() + 10
        while metric(srv.base, "draftkit:num_requests_running") > 0:
            assert time.time() < deadline, "the slot was not freed"
            time.sleep(0.05)
        assert metric(srv.base, "draftkit:request_success_total", finished_reason="abort") == 1
        assert httpx.get(f"{srv.base}/health").status_code == 200
        r = c.completions.create(model="tiny", prompt="hello", max_tokens=5)
        assert r.usage.completion_tokens == 5
        # a non-streaming client that gives up is noticed too
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{srv.url}/completions", json={"model": "tiny", "prompt": "hi",
                                                       "max_tokens": 200}, timeout=0.3)
        deadline = time.time() + 10
        while metric(srv.base, "draftkit:num_requests_running") > 0:
            assert time.time() < deadline, "the slot was not freed"
            time.sleep(0.05)
        assert metric(srv.base, "draftkit:request_success_total", finished_reason="abort") == 2
    finally:
        srv.stop()


def test_general_runner_serves_in_cohorts(tiny_models):
    tok = tiny_models[0]
    srv = start_server(tiny_models, k=2, max_batch=4, fast_path=False)
    try:
        c = srv.client()
        prompts = WORDS[:6]
        out = [None] * 6

        def go(i):
            out[i] = c.completions.create(model="tiny", prompt=prompts[i], temperature=0,
                                          max_tokens=10)

        threads = [threading.Thread(target=go, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        refs = offline(tiny_models, [tok(p)["input_ids"] for p in prompts], 10)
        assert [o.choices[0].text for o in out] == [
            tok.decode(r.tokens, skip_special_tokens=True) for r in refs]
    finally:
        srv.stop()


def test_a_failed_admission_answers_its_requests_and_the_server_goes_on(tiny_models):
    """Requests taken off the queue when admission fails get an error, not a hang."""
    srv = start_server(tiny_models, k=2, max_batch=4)
    try:
        admit = srv.app.state.scheduler.engine.admit
        calls = {"n": 0}

        def fails_once(*a, **k):
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("out of memory")
            return admit(*a, **k)

        srv.app.state.scheduler.engine.admit = fails_once
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 4, "temperature": 0}
        r = httpx.post(f"{srv.url}/completions", json=body, timeout=30)
        assert r.status_code == 500 and "out of memory" in r.json()["error"]["message"]
        assert httpx.post(f"{srv.url}/completions", json=body, timeout=30).status_code == 200
    finally:
        srv.stop()
