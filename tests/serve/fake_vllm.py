"""A stand-in for vLLM's OpenAI server, as the front sees it: ``/health``, ``/v1/models`` and the
two completions endpoints, answering as vLLM 0.32 does with ``return_token_ids`` and
``--per-request-spec-decode-metrics detailed`` (token ids, per-step drafted/accepted counts in
``metrics.speculative_decoding``, streamed with the counts on the usage chunk). Its answers are
a fixed function of the prompt, so a test knows them; ``mode`` makes it fail as an upstream can.

Modes: ``ok``; ``error500`` (a 500 with vLLM's error body); ``malformed`` (200 with a body that
is not JSON); ``cut`` (a stream that stops after two chunks, no ``[DONE]``); ``no_metrics`` (as
a server started without the per-request flag); ``worse`` (a draft that accepts nothing);
``delay``: seconds each request waits first.
"""

from __future__ import annotations

import asyncio
import json

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

K = 3
VOCAB = 100


def tokens(prompt: list[int], n: int) -> list[int]:
    """The completion: a fixed function of the prompt."""
    return [(sum(prompt) + 7 * i) % VOCAB for i in range(n)]


def steps(n: int, worse: bool = False) -> tuple[list[int], list[int]]:
    """(drafted, accepted) per verify step for ``n`` tokens: the prefill gives one, then steps
    accept 2, 0, 1, 2, 0, 1, ... (``worse``: none) and each adds its bonus token."""
    drafted, accepted, made, cycle = [], [], 1, [0, 0, 0] if worse else [2, 0, 1]
    while made < n:
        a = min(cycle[len(accepted) % 3], n - made - 1)
        drafted.append(K)
        accepted.append(a)
        made += a + 1
    return drafted, accepted


def spec_metrics(n: int, worse: bool = False) -> dict:
    drafted, accepted = steps(n, worse)
    hist = [accepted.count(j) for j in range(K + 1)]
    return {"mean_acceptance_length": 1 + sum(accepted) / max(len(accepted), 1),
            "draft_acceptance_rate": sum(accepted) / max(sum(drafted), 1),
            "acceptance_histogram": hist, "num_spec_steps": len(accepted),
            "num_accepted_draft_tokens": sum(accepted), "num_draft_tokens": sum(drafted),
            "num_spec_tokens": K, "per_step_accepted": accepted, "per_step_drafted": drafted}


def prompt_ids(body: dict, chat: bool) -> list[int]:
    if chat:
        return [len(m.get("content", "")) % VOCAB for m in body["messages"]] + [1]
    prompt = body["prompt"]
    return list(prompt) if isinstance(prompt, list) else [ord(c) % VOCAB for c in prompt]


def create(model: str = "upstream-model", max_model_len: int = 256) -> FastAPI:
    app = FastAPI()
    app.state.mode, app.state.delay = "ok", 0.0
    app.state.bodies, app.state.running, app.state.most = [], 0, 0

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model, "object": "model",
                                            "max_model_len": max_model_len}]}

    async def answer(request: Request, chat: bool):
        body = await request.json()
        app.state.bodies.append(body)
        app.state.running += 1
        app.state.most = max(app.state.most, app.state.running)
        try:
            if app.state.delay:
                await asyncio.sleep(app.state.delay)
            if app.state.mode == "error500":
                return JSONResponse({"error": {"message": "engine core died", "type":
                                               "InternalServerError", "code": 500}}, 500)
            if app.state.mode == "malformed":
                return Response("<html>bad gateway</html>", media_type="text/html")
            if body.get("model") != model:
                return JSONResponse({"error": {"message": f"The model `{body.get('model')}` "
                                               f"does not exist.", "type": "NotFoundError",
                                               "param": "model", "code": 404}}, 404)
            if body.get("max_tokens", 16) > max_model_len:
                return JSONResponse({"error": {"message": "max_tokens too large", "type":
                                               "BadRequestError", "param": "max_tokens",
                                               "code": 400}}, 400)
            n = body.get("max_tokens") or body.get("max_completion_tokens") or 16
            prompt = prompt_ids(body, chat)
            out = tokens(prompt, n)
            metrics = None if app.state.mode == "no_metrics" else \
                spec_metrics(n, worse=app.state.mode == "worse")
            ids = body.get("return_token_ids") is True
            choices = body.get("n", 1)
            if body.get("stream"):
                return StreamingResponse(stream(body, chat, prompt, out, metrics, ids, choices),
                                         media_type="text/event-stream")
            return body_answer(body, chat, prompt, out, metrics, ids, choices)
        finally:
            app.state.running -= 1

    def body_answer(body, chat, prompt, out, metrics, ids, n_choices):
        text = " ".join(f"w{t}" for t in out)
        choices = []
        for i in range(n_choices):
            choice = {"index": i, "finish_reason": "length", "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
                choice["prompt_token_ids"] = prompt if ids else None
            choice["token_ids"] = out if ids else None
            choices.append(choice)
        result = {"id": "cmpl-fake", "object": "chat.completion" if chat else
                  "text_completion", "created": 1, "model": model, "choices": choices,
                  "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(out),
                            "total_tokens": len(prompt) + len(out)}}
        if chat:
            result["prompt_token_ids"] = prompt if ids else None
        if metrics is not None and n_choices == 1:
            result["metrics"] = {"speculative_decoding": metrics}
        return result

    async def stream(body, chat, prompt, out, metrics, ids, n_choices):
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choice: dict, **extra) -> str:
            return "data: " + json.dumps({"id": "cmpl-fake", "object": obj, "created": 1,
                                          "model": model, "choices": [choice], **extra}) + "\n\n"

        if chat:
            yield chunk({"index": 0, "delta": {"role": "assistant", "content": ""},
                         "finish_reason": None}, prompt_token_ids=prompt if ids else None)
        for i, t in enumerate(out):
            if app.state.mode == "cut" and i == 2:
                return
            last = i == len(out) - 1
            for index in range(n_choices):  # the choices' chunks interleaved, as vLLM's
                choice = {"index": index, "finish_reason": "length" if last else None}
                if chat:
                    choice["delta"] = {"content": f" w{t}"}
                else:
                    choice["text"] = f" w{t}"
                    if i == 0:
                        choice["prompt_token_ids"] = prompt if ids else None
                if ids:
                    choice["token_ids"] = [t]
                yield chunk(choice)
            await asyncio.sleep(0)
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            final = {"id": "cmpl-fake", "object": obj, "created": 1, "model": model,
                     "choices": [], "usage": {"prompt_tokens": len(prompt),
                                              "completion_tokens": len(out),
                                              "total_tokens": len(prompt) + len(out)}}
            if metrics is not None and n_choices == 1:
                final["metrics"] = {"speculative_decoding": metrics}
            yield "data: " + json.dumps(final) + "\n\n"
        yield "data: [DONE]\n\n"

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answer(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await answer(request, chat=True)

    return app
