"""A live server on tiny random models: the app in-process, uvicorn in a background thread."""

from __future__ import annotations

import socket
import threading
import time

import pytest


class LiveServer:
    """uvicorn serving ``app`` on 127.0.0.1 in a thread; ``url`` is the API base."""

    def __init__(self, app):
        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.app = app
        self.base = f"http://127.0.0.1:{port}"
        self.url = f"{self.base}/v1"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                                    log_level="warning",
                                                    timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)

    @property
    def scheduler(self):
        return self.app.state.scheduler

    def client(self):
        import openai

        return openai.OpenAI(base_url=self.url, api_key="x", max_retries=0, timeout=60)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="session")
def tiny_models():
    """(tokenizer, target, draft): a 3-layer target and a noisy copy of it as the draft, so
    rounds accept several tokens."""
    from tests.decode.helpers import noisy_copy
    from tests.tiny import make_llama, make_tokenizer

    tok = make_tokenizer()
    target = make_llama(len(tok), num_layers=3, seed=0)
    return tok, target, noisy_copy(target)


def start_server(tiny_models, **kw) -> LiveServer:
    from draftkit.decode.engine import SpeculativeEngine
    from draftkit.serve.app import create_app

    tok, target, draft = tiny_models
    fast = kw.pop("fast_path", None)
    engine = SpeculativeEngine(target, draft, fast_path=fast)
    kw.setdefault("model_name", "tiny")
    return LiveServer(create_app(engine, tok, **kw))


@pytest.fixture(scope="module")
def server(tiny_models):
    """Fixed K = 2, 8 slots."""
    s = start_server(tiny_models, k=2, max_batch=8, max_tokens_limit=64)
    yield s
    s.stop()
