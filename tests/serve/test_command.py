"""``draftkit serve``: flags, model resolution, and a real process shut down by SIGTERM."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from draftkit.cli import build_parser, main, parse
from draftkit.config import from_namespace
from draftkit.errors import ConfigError
from draftkit.serve.args import ServeArgs
from draftkit.serve.command import build, resolve_models
from tests.helpers import write_manifest


def test_bad_flags_are_one_line_errors(capsys, tmp_path):
    assert main(["serve"]) == 2
    assert "give a BUNDLE" in capsys.readouterr().err
    assert main(["serve", str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert main(["serve", "--target", "x", "--k", "lots"]) == 2
    assert "--k" in capsys.readouterr().err
    assert main(["serve", "--target", "x", "--shutdown-timeout", "-1"]) == 2
    assert "--shutdown-timeout must be >= 0, got -1" in capsys.readouterr().err


def test_resolve_bundle_and_plain_dirs(tmp_path):
    bundle = tmp_path / "smol-bundle"
    (bundle / "draft").mkdir(parents=True)
    write_manifest(bundle)
    assert resolve_models(ServeArgs(bundle=str(bundle))) == (str(bundle), str(bundle),
                                                             "smol-bundle")
    plain = tmp_path / "plain"
    plain.mkdir()
    assert resolve_models(ServeArgs(bundle=str(plain), draft="d", served_model_name="m")) == (
        str(plain), "d", "m")
    # --draft none: plain decoding, though the bundle holds a draft
    args = from_namespace(ServeArgs, parse(build_parser(), ["serve", str(bundle), "--draft",
                                                            "none"]))
    assert resolve_models(args) == (str(bundle), None, "smol-bundle")


def test_a_context_with_no_room_is_a_one_line_error(tiny_dirs):
    """A round takes K + 2 positions of each slot: 10 positions leave none under --k auto
    with K up to 8."""
    target, draft = tiny_dirs
    with pytest.raises(ConfigError, match=r"10 positions per slot \(--max-model-len.*raise "
                                          r"--max-model-len or lower K"):
        build(ServeArgs(bundle=str(target), draft=str(draft), max_model_len=10, k="auto",
                        k_max=8, device="cpu"))
    app, _, _ = build(ServeArgs(bundle=str(target), draft=str(draft), max_model_len=10, k=2,
                             device="cpu"))
    assert app.state.scheduler.context == 6


def test_build_from_model_dirs(tiny_dirs):
    target, draft = tiny_dirs
    app, desc, _ = build(ServeArgs(bundle=str(target), draft=str(draft), max_batch=2,
                                max_model_len=64, device="cpu"))
    assert "continuous batching" in desc and app.state.scheduler.batch.max_len == 64


@pytest.mark.slow  # starts draftkit in another Python
def test_sigterm_finishes_in_flight_and_exits_0(tiny_dirs):
    target, draft = tiny_dirs
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "draftkit", "serve", str(target), "--draft",
                             str(draft), "--port", str(port), "--k", "2", "--device", "cpu",
                             "--log-level", "warning"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "the server did not come up"
            time.sleep(0.2)
        lines = []
        with httpx.stream("POST", f"{base}/v1/completions", timeout=30, json={
                "model": "target", "prompt": "hello", "max_tokens": 40, "stream": True,
                "stream_options": {"include_usage": True}}) as r:
            for line in r.iter_lines():
                if line and not lines:
                    proc.send_signal(signal.SIGTERM)  # mid-stream
                if line:
                    lines.append(line)
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[-2][6:])["usage"]["completion_tokens"] >= 1
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
