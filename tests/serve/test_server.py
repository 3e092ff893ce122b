"""The HTTP server end to end on tiny models, through the official ``openai`` client."""

import json
import logging
import threading
import time

import httpx
import pytest

from tests.helpers import make_mistral, start_server

WORDS = ["hello world", "the sum of two", "write python code", "what is the answer",
         "a poem about water", "translate this story", "how many people", "first day of time"]


def offline(tiny_models, prompts_ids, n):
    """Plain decoding (K = 0), one prompt at a time: the reference for greedy outputs."""
    from draftkit.decode.engine import SpeculativeEngine

    _, target, draft = tiny_models
    engine = SpeculativeEngine(target, draft)
    return [engine.generate([p], k=0, max_new_tokens=n)[0] for p in prompts_ids]


def text_after(tok, prompt_ids, ids) -> str:
    """The text ``ids`` add after the prompt: a completion's text (its first token keeps the
    space before it)."""
    before = tok.decode(prompt_ids, skip_special_tokens=True)
    return tok.decode(prompt_ids + ids, skip_special_tokens=True)[len(before):]


def metric(base: str, name: str, **labels) -> float:
    total = 0.0
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def concurrent_greedy(client, prompts: list[str], max_tokens) -> list:
    """Greedy completions of ``prompts``, all sent at once (a thread each); ``max_tokens``: one
    budget for all, or one per prompt."""
    budgets = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    out: list = [None] * len(prompts)

    def go(i):
        out[i] = client.completions.create(model="tiny", prompt=prompts[i], temperature=0,
                                           max_tokens=budgets[i])

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


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


def test_a_requests_tau_is_the_engines(server, tiny_models):
    """Tokens per decoding round, the prefill left out, as Result.tau and the metrics say
    (it used to count the prefill as a round: 1.333 where the engine says 1.375)."""
    from draftkit.decode.engine import SpeculativeEngine

    tok, target, draft = tiny_models
    r = httpx.post(f"{server.url}/completions", json={
        "model": "tiny", "prompt": "what is", "max_tokens": 12, "temperature": 0}).json()
    alone = SpeculativeEngine(target, draft).generate([tok("what is")["input_ids"]], k=2,
                                                      max_new_tokens=12)[0]
    assert r["usage"]["completion_tokens"] == len(alone.tokens)
    assert r["draftkit"]["tau"] == round(alone.tau, 4)
    assert r["draftkit"]["target_calls"] == alone.stats.target_calls


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


def test_raw_sse_ends_with_done(server, monkeypatch):
    real = time.time
    ticks = iter(range(10**6))
    monkeypatch.setattr(time, "time", lambda: real() + next(ticks))  # a second per call
    with httpx.stream("POST", f"{server.url}/completions", json={
            "model": "tiny", "prompt": "hello", "max_tokens": 4, "stream": True}) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]" and all(ln.startswith("data: ") for ln in lines)
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert len({c["created"] for c in chunks}) == 1  # the request's time, in every chunk
    # as OpenAI: usage only in a chunk of its own, with stream_options.include_usage
    assert chunks[-1]["choices"][0]["finish_reason"] and "usage" not in chunks[-1]


def test_concurrent_greedy_equals_offline(tiny_models):
    """32 concurrent requests on 16 slots under --k auto: every output is token for token
    what plain decoding of that prompt alone gives."""
    tok = tiny_models[0]
    srv = start_server(tiny_models, k="auto", k_max=4, max_batch=16)
    try:
        c = srv.client()
        prompts = [f"{WORDS[i % 8]} {i % 10}" for i in range(32)]
        budgets = [6 + (i * 7) % 20 for i in range(32)]
        out = concurrent_greedy(c, prompts, budgets)
        ids = [tok(p)["input_ids"] for p in prompts]
        for i, ref in enumerate(offline(tiny_models, ids, max(budgets))):
            toks = ref.tokens[:budgets[i]]
            if tok.eos_token_id in toks:
                toks = toks[:toks.index(tok.eos_token_id) + 1]
            assert out[i].usage.completion_tokens == len(toks), i
            assert out[i].choices[0].text == text_after(tok, ids[i], toks), i
        assert metric(srv.base, "draftkit:request_success_total") == 32
    finally:
        srv.stop()


def test_stop_strings_are_cut(server, tiny_models):
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
    # usage counts the tokens up to the one that completed the stop, not the rest of its
    # round; stops at several places end rounds early or late
    tok = tiny_models[0]
    prompt = tok("what is")["input_ids"]
    toks = offline(tiny_models, [prompt], 12)[0].tokens
    for i in range(1, 6):
        stop = " " + words[i]
        r = c.completions.create(model="tiny", prompt="what is", max_tokens=12,
                                 temperature=0, stop=stop)
        assert r.usage.completion_tokens == next(
            n for n in range(13) if stop in text_after(tok, prompt, toks[:n])), stop


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


def test_a_server_started_with_block_verification_verifies_sampled_requests_so(
        tiny_models, monkeypatch):
    import draftkit.decode.verify as verify_module

    rows = []
    real = verify_module.block_verify
    monkeypatch.setattr(verify_module, "block_verify",
                        lambda d, *a: rows.append(d.shape[0]) or real(d, *a))
    srv = start_server(tiny_models, k=2, verify="block")
    try:
        kw = dict(model="tiny", prompt="a poem about", max_tokens=8)
        srv.client().completions.create(temperature=0, **kw)
        assert not rows  # greedy: the argmax verdict, whatever the rule
        srv.client().completions.create(temperature=1.0, seed=3, **kw)
        assert rows
    finally:
        srv.stop()


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
    ({"model": "tiny", "prompt": 5}, "prompt"),
    ({"model": "tiny", "prompt": "hi", "frequency_penalty": 0.5}, "frequency_penalty"),
    ({"model": "tiny", "prompt": "hi", "seed": 2**64}, "seed"),
    ({"model": "tiny", "prompt": "hi", "stream": "yes"}, "stream"),
    ({"model": "tiny", "prompt": "hi", "max_tokens": "4"}, "max_tokens"),
    ({"model": "tiny", "prompt": "hi", "max_tokens": True}, "max_tokens"),
    # valid JSON (json.dumps escapes it as \\ud800) that no tokenizer can encode
    (json.dumps({"model": "tiny", "prompt": "hello \ud800"}).encode(), "prompt"),
    (json.dumps({"model": "tiny", "prompt": "hi", "stop": ["\udc00"]}).encode(), "stop.0"),
    ({"model": "tiny", "prompt": "hi", "logprobs": 1}, "logprobs"),
    ({"model": "tiny", "prompt": "hi", "echo": True}, "echo"),
    ({"model": "tiny", "prompt": "hi", "stream_options": {"include_usage": True}},
     "stream_options"),
], ids=["json", "unknown-field", "negative-max-tokens", "zero-max-tokens", "temperature",
        "top-p", "n", "over-limit", "overlong-prompt", "prompt-plus-output", "prompt-type",
        "penalty", "seed-beyond-64-bits", "string-bool", "string-int", "bool-int",
        "lone-surrogate", "lone-surrogate-stop", "logprobs", "echo", "stream-options-unstreamed"])
def test_bad_requests_are_400_with_openai_body(server, body, param):
    kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(
        body, bytes) else {"json": body}
    r = httpx.post(f"{server.url}/completions", **kw)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] is None and err["message"]
    assert err["param"] == param


def test_unknown_model_is_404_model_not_found(server):
    r = httpx.post(f"{server.url}/completions", json={"model": "gpt-4", "prompt": "hi"})
    assert r.status_code == 404, r.text
    assert r.json()["error"] == {"message": "the model 'gpt-4' does not exist; this server "
                                            "serves 'tiny'", "type": "invalid_request_error",
                                 "param": "model", "code": "model_not_found"}


def test_bad_chat_and_body_limit(server):
    def chat(**body):
        return httpx.post(f"{server.url}/chat/completions", json={"model": "tiny", **body})

    r = chat(messages=[{"role": "user", "content": "hi", "extra": 1}])
    assert r.status_code == 400 and "extra" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "messages.0.extra"
    r = chat(messages=[])
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    for ctype, named in (("text/plain", "got text/plain"), (None, "got no Content-Type")):
        r = httpx.post(f"{server.url}/chat/completions", content=body,
                       headers={"content-type": ctype} if ctype else {})
        message = r.json()["error"]["message"]
        assert r.status_code == 400 and "Content-Type: application/json" in message, message
        assert named in message
    r = httpx.post(f"{server.url}/chat/completions", content=body,
                   headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code == 200, r.text
    # the field's path, without pydantic's tag for the member of a union ("content.str")
    r = chat(messages=[{"role": "user", "content": "hi"}, {"role": "user", "content": 5}])
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.1.content"
    r = httpx.post(f"{server.url}/chat/completions", headers={"content-type": "application/json"},
                   content=json.dumps({"model": "tiny", "messages": [
                       {"role": "user", "content": [{"type": "text", "text": "hi \ud83d"}]}]}))
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "messages.0.content.0.text", err
    assert "lone UTF-16 surrogate" in err["message"]
    # of a union's errors, the member the client sent (the list), not the first (the string)
    r = chat(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}])
    err = r.json()["error"]
    assert err["param"] == "messages.0.content.0.text", err
    assert err["message"] == "messages.0.content.0.text: Input should be a valid string"
    for field, value in (("logprobs", True), ("tools", [{"type": "function"}]),
                         ("tool_choice", "auto")):  # refused, and named
        r = chat(messages=[{"role": "user", "content": "hi"}], **{field: value})
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == field, err
        assert err["message"] == f"{field}: {field} is not supported"
    # the limit named as the client sent it
    r = chat(messages=[{"role": "user", "content": "hi"}], max_completion_tokens=65)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "max_completion_tokens"
    assert err["message"].startswith("max_completion_tokens is 65")
    r = httpx.post(f"{server.url}/completions", json={"model": "tiny", "prompt": "x" * (2 << 20)})
    assert r.status_code == 413 and "error" in r.json()

    def chunked():  # no Content-Length: counted as it arrives
        for _ in range(3000):
            yield b"x" * 1024

    rejected = {s: metric(server.base, "draftkit:request_rejected_total", status=s)
                for s in ("400", "413")}
    r = httpx.post(f"{server.url}/completions", content=chunked(),
                   headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert r.json()["error"]["message"].startswith("the request body is over 1048576 bytes")
    assert {s: metric(server.base, "draftkit:request_rejected_total", status=s)
            for s in ("400", "413")} == {"400": rejected["400"], "413": rejected["413"] + 1}


def test_null_means_the_default(server):
    for field in ("n", "stream", "presence_penalty", "frequency_penalty", "echo", "logprobs",
                  "stop", "seed", "max_tokens", "temperature", "top_p", "top_k", "user",
                  "stream_options", "logit_bias", "best_of", "suffix", "model"):
        r = httpx.post(f"{server.url}/completions", json={"model": "tiny", "prompt": "hi",
                                                          "max_tokens": 2, field: None})
        assert r.status_code == 200, (field, r.text)
        assert r.json()["usage"]["completion_tokens"] <= (16 if field == "max_tokens" else 2)
    r = httpx.post(f"{server.url}/completions", json={
        "model": "tiny", "prompt": "hi", "max_tokens": 2, "stream": True,
        "stream_options": {"include_usage": None}})
    assert r.status_code == 200 and "usage" not in r.text, r.text
    r = httpx.post(f"{server.url}/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi", "name": None}],
        "max_tokens": 2, "max_completion_tokens": None, "logprobs": None,
        "top_logprobs": None, "response_format": None, "tools": None, "tool_choice": None,
        "parallel_tool_calls": None})
    assert r.status_code == 200, r.text


def test_a_tiny_temperature_is_greedy(server):
    """1e-40 would overflow the logits to inf (NaN probabilities, token 0 every time)."""
    body = {"model": "tiny", "prompt": "what is", "max_tokens": 8}
    greedy = httpx.post(f"{server.url}/completions", json=dict(body, temperature=0)).json()
    for t in (1e-40, 1e-8):
        r = httpx.post(f"{server.url}/completions", json=dict(body, temperature=t))
        assert r.json()["choices"][0]["text"] == greedy["choices"][0]["text"], t


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


def test_a_request_being_prefilled_counts_as_running(tiny_models):
    """While its prompt is prefilled a request is off the queue and counted running, as vLLM
    counts it: /metrics never shows an admitted request in neither gauge."""
    from draftkit.decode.engine import SpeculativeEngine
    from draftkit.serve.app import create_app
    from tests.helpers import LiveServer

    tok, target, draft = tiny_models
    srv = LiveServer(create_app(SpeculativeEngine(target, draft), tok, model_name="tiny", k=2,
                                max_batch=2))
    try:
        seen = []
        batch = srv.scheduler.batch
        admit = batch.admit

        def slow_admit(*args, **kw):  # /metrics read while the prompt is being prefilled
            seen.append((metric(srv.base, "draftkit:num_requests_running"),
                         metric(srv.base, "draftkit:num_requests_waiting")))
            return admit(*args, **kw)

        batch.admit = slow_admit
        srv.client().completions.create(model="tiny", prompt="hello", max_tokens=3)
        assert seen == [(1.0, 0.0)]
    finally:
        srv.stop()


def test_client_gone_mid_stream_frees_its_slot(tiny_models):
    """Close a stream after two chunks: the row is aborted and its slot freed at the next
    round, and the server keeps serving. Rounds are slowed so the row cannot finish first."""
    from draftkit.decode.engine import SpeculativeEngine
    from draftkit.serve.app import create_app
    from tests.helpers import LiveServer

    tok, target, draft = tiny_models
    engine = SpeculativeEngine(target, draft, eos_token_id=None)  # never stops by itself
    app = create_app(engine, tok, model_name="tiny", k=2, max_batch=2)
    batch = app.state.scheduler.batch
    step = batch.step

    def slow_step():
        time.sleep(0.01)
        return step()

    batch.step = slow_step
    srv = LiveServer(app)
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


def test_a_request_cancelled_in_the_queue_leaves_it_as_an_abort(tiny_models):
    """Its client went away before a slot freed: it is out of the queue at once (the
    waiting gauge drops), counted once as an abort, and never admitted."""
    import asyncio

    from prometheus_client import generate_latest

    from draftkit.decode.choice import resolve_k
    from draftkit.decode.engine import SpeculativeEngine
    from draftkit.decode.sampling import SamplingParams
    from draftkit.serve.detok import TextStream
    from draftkit.serve.metrics import ServeMetrics
    from draftkit.serve.scheduler import Job, Scheduler

    tok, target, draft = tiny_models
    metrics = ServeMetrics("tiny")
    sched = Scheduler(SpeculativeEngine(target, draft), metrics, max_batch=1,
                      k=resolve_k(2, has_draft=True))
    loop = asyncio.new_event_loop()
    try:
        jobs = [Job([5, 6, 7], SamplingParams(0.0, 0, 1.0), 4, None,
                    TextStream(tok, None, [5, 6, 7]), loop) for _ in range(3)]
        for job in jobs:
            sched.submit(job)
        sched.cancel(jobs[1])
        sched.cancel(jobs[1])  # a second cancel (the stream and the request both end) is a no-op

        def value(name: str, **labels) -> float:
            text = generate_latest(metrics.registry).decode()
            return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith(name + "{")
                       and all(f'{k}="{v}"' in line for k, v in labels.items()))
        assert list(sched.waiting) == [jobs[0], jobs[2]]
        assert value("draftkit:num_requests_waiting") == 2
        assert value("draftkit:request_success_total", finished_reason="abort") == 1
        sched._admit()  # one free slot: the first job, not the cancelled one behind it
        assert [j.slot is not None for j in jobs] == [True, False, False]
        assert list(sched.waiting) == [jobs[2]]
    finally:
        loop.close()


def test_a_health_probe_while_stopping_is_not_a_rejected_request(tiny_models):
    srv = start_server(tiny_models, k=2)
    try:
        srv.scheduler.stop()
        assert httpx.get(f"{srv.base}/health").status_code == 503
        assert metric(srv.base, "draftkit:request_rejected_total") == 0
        r = httpx.post(f"{srv.url}/completions", json={"model": "tiny", "prompt": "hi"})
        assert r.status_code == 503  # a request refused while stopping still counts
        assert metric(srv.base, "draftkit:request_rejected_total", status="503") == 1
    finally:
        srv.stop()


def test_a_stream_whose_client_left_before_its_first_chunk_is_cancelled():
    """Its body generator never starts, so the generator's own finally cannot free the slot;
    the response does, however it ends."""
    import asyncio

    from starlette.requests import ClientDisconnect

    from draftkit.serve.http import Stream

    started, exits = [], []

    async def body():
        started.append(1)
        yield "data: x\n\n"

    async def receive():
        return {"type": "http.disconnect"}

    async def send(message):
        raise OSError("the client is gone")

    response = Stream(body(), on_exit=lambda: exits.append(1))
    with pytest.raises(ClientDisconnect):  # Starlette's name for the OSError
        asyncio.run(response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send))
    assert exits == [1] and not started


def test_general_runner_serves_in_cohorts(tiny_models):
    tok = tiny_models[0]
    srv = start_server(tiny_models, k=2, max_batch=4, fast_path=False)
    try:
        c = srv.client()
        prompts = WORDS[:6]
        out = concurrent_greedy(c, prompts, 10)
        ids = [tok(p)["input_ids"] for p in prompts]
        refs = offline(tiny_models, ids, 10)
        assert [o.choices[0].text for o in out] == [
            text_after(tok, p, r.tokens) for p, r in zip(ids, refs)]
    finally:
        srv.stop()


def test_a_sliding_window_pair_serves_concurrent_requests_exactly(tiny_models):
    """The general path batches a sliding-window pair one row at a time (a batched cache
    would count padding and rolled-back holes into the window): concurrent greedy requests
    still equal the target's own greedy text."""
    from tests.helpers import hf_greedy, noisy_copy

    tok = tiny_models[0]
    target = make_mistral(2, 0, 32, vocab=len(tok))
    srv = start_server((tok, target, noisy_copy(target)), k=2, max_batch=4)
    try:
        assert srv.scheduler.engine.one_row_cohorts
        # prompts of unequal length, answers that run up to the window (32 - 4 - K - 2)
        prompts = ["hello", "the sum of two", "what is the answer", "a poem about water"]
        out = concurrent_greedy(srv.client(), prompts, 22)
        ids = [tok(p)["input_ids"] for p in prompts]
        assert max(map(len, ids)) == 4 and min(map(len, ids)) == 1
        assert [o.choices[0].text for o in out] == [
            text_after(tok, p, hf_greedy(target, p, 22)) for p in ids]
    finally:
        srv.stop()


def test_a_failed_admission_answers_its_requests_and_the_server_goes_on(tiny_models):
    """Requests taken off the queue when admission fails get an error, not a hang."""
    srv = start_server(tiny_models, k=2, max_batch=4)
    try:
        admit = srv.app.state.scheduler.batch.admit
        calls = {"n": 0}

        def fails_once(*a, **k):
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("out of memory")
            return admit(*a, **k)

        srv.app.state.scheduler.batch.admit = fails_once
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 4, "temperature": 0}
        r = httpx.post(f"{srv.url}/completions", json=body, timeout=30)
        assert r.status_code == 500 and "out of memory" in r.json()["error"]["message"]
        assert httpx.post(f"{srv.url}/completions", json=body, timeout=30).status_code == 200
    finally:
        srv.stop()


def test_template_errors_are_400_and_bugs_a_logged_500(tiny_models, caplog, monkeypatch):
    """A chat template may refuse messages (jinja's raise_exception); anything else that
    escapes is a bug: a 500 in the OpenAI shape, its traceback in the log."""
    from draftkit.decode.engine import SpeculativeEngine
    from draftkit.serve.app import create_app
    from tests.helpers import LiveServer
    from tests.helpers import make_tokenizer

    _, target, draft = tiny_models
    tok = make_tokenizer()
    tok.chat_template = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System "
                         "role not supported') }}{% endif %}" + tok.chat_template)
    srv = LiveServer(create_app(SpeculativeEngine(target, draft), tok, model_name="tiny", k=2,
                                max_batch=2))
    try:
        body = {"model": "tiny", "max_tokens": 3, "messages": [
            {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}
        r = httpx.post(f"{srv.url}/chat/completions", json=body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "messages" and "System role not supported" in err["message"]
        assert httpx.post(f"{srv.url}/chat/completions",
                          json=dict(body, messages=body["messages"][1:])).status_code == 200

        def bug(job):
            raise KeyError("oops")

        srv.scheduler.submit = bug
        monkeypatch.setattr(logging.getLogger("uvicorn"), "propagate", True)  # to caplog
        r = httpx.post(f"{srv.url}/completions", json={"model": "tiny", "prompt": "hi"})
        assert r.status_code == 500, r.text
        assert r.json()["error"] == {"message": "internal error (KeyError); see the server's "
                                                "log", "type": "server_error", "param": None,
                                     "code": None}
        deadline = time.time() + 10  # uvicorn logs the traceback after the answer is sent
        while "KeyError: 'oops'" not in caplog.text:
            assert time.time() < deadline, "no traceback in the log"
            time.sleep(0.05)
        assert "Exception in ASGI application" in caplog.text
    finally:
        srv.stop()


def test_an_eagle3_head_serves_concurrent_requests_exactly(tiny_models, tmp_path):
    """An EAGLE-3 head as the draft, built from folders as `draftkit serve` builds it: at a
    fixed K (under --k auto whether a round drafts depends on the clock, and a loaded machine
    can rule speculation out for these short requests), concurrent greedy requests of unequal
    prompts and budgets equal the target's own greedy text, rounds draft and accept, and a
    sampled request is answered too."""
    from draftkit.serve.args import ServeArgs
    from draftkit.serve.command import build
    from tests.helpers import LiveServer, fit_eagle3, hf_greedy, make_llama, save_head, save_model

    tok = tiny_models[0]
    target = make_llama(len(tok), num_layers=4, seed=0)  # three distinct layers to tap
    save_model(target, tok, tmp_path / "target")
    save_head(fit_eagle3(target, steps=60), tmp_path / "head", tmp_path / "target")
    app, desc, _ = build(ServeArgs(bundle=str(tmp_path / "target"), draft=str(tmp_path / "head"),
                                k=2, k_max=4, max_batch=4, max_model_len=96,
                                device="cpu", dtype="float32", served_model_name="tiny"))
    assert f"draft {(tmp_path / 'head').resolve()}" in desc and "continuous" in desc
    srv = LiveServer(app)
    try:
        c = srv.client()
        prompts = WORDS[:6]
        budgets = [6 + (i * 5) % 14 for i in range(6)]
        out = concurrent_greedy(c, prompts, budgets)
        ids = [tok(p)["input_ids"] for p in prompts]
        for i, (p, n) in enumerate(zip(ids, budgets)):
            toks = hf_greedy(target, p, n)
            if tok.eos_token_id in toks:
                toks = toks[:toks.index(tok.eos_token_id) + 1]
            assert out[i].choices[0].text == text_after(tok, p, toks), i
        assert sum(o.model_extra["draftkit"]["drafted"] for o in out) > 0
        assert sum(o.model_extra["draftkit"]["accepted"] for o in out) > 0
        r = c.completions.create(model="tiny", prompt="hello", max_tokens=8, temperature=0.8,
                                 seed=1)
        assert r.usage.completion_tokens >= 1
    finally:
        srv.stop()
