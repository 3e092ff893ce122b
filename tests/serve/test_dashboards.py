"""serve/grafana.json and serve/alerts.yml read series both engines export: every draftkit
metric name they query is in /metrics of draftkit's own server and of the front over vLLM
(a stand-in upstream), after a request and with the bundle's eval figures set."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import yaml

from draftkit.manifest import DomainEntry
from draftkit.serve.app import create_proxy_app
from draftkit.serve.upstream import Pool, discover
from draftkit.serve.vllm_front import NoSwap
from tests.helpers import LiveServer, start_server
from tests.serve import fake_vllm

SERVE = Path(__file__).resolve().parents[2] / "serve"
NAME = re.compile(r"draftkit:[a-z0-9_]+")


def queried() -> dict[str, set[str]]:
    """File -> the draftkit series its queries name."""
    rules = yaml.safe_load((SERVE / "alerts.yml").read_text())
    alerts = " ".join(r["expr"] for g in rules["groups"] for r in g["rules"])
    board = json.loads((SERVE / "grafana.json").read_text())
    panels = " ".join(t["expr"] for p in board["panels"] for t in p["targets"])
    templating = " ".join(v.get("query", "") for v in board["templating"]["list"])
    return {"alerts.yml": set(NAME.findall(alerts)),
            "grafana.json": set(NAME.findall(panels + templating))}


SAMPLES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def exported(text: str) -> set[str]:
    """The series names /metrics declares (``# TYPE``: a labelled counter has no sample before
    its first event, and Prometheus has the series once it happens)."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE draftkit:"):
            _, _, family, kind = line.split()
            family = family.removesuffix("_total")  # some prometheus_client releases keep it
            names |= {family + suffix for suffix in SAMPLES[kind]}
    return names


def check(metrics_text: str, engine: str) -> None:
    names = exported(metrics_text)
    for file, wanted in queried().items():
        assert wanted, f"{file} queries no draftkit series"
        missing = sorted(wanted - names)
        assert not missing, f"{file} queries series {engine} does not export: {missing}"


def test_the_dashboard_and_alerts_read_series_the_front_over_vllm_exports():
    upstream = LiveServer(fake_vllm.create())
    pool = Pool([discover(upstream.base, "draft-a")])
    app = create_proxy_app(pool, model_name="served", vocab=fake_vllm.VOCAB, swapper=NoSwap())
    app.state.metrics.eval_figures({"code": DomainEntry(alpha=0.5, tau=None, c=None, k=None,
                                                        speedup_measured=None,
                                                        speedup_predicted=None, verdict=None)})
    srv = LiveServer(app)
    try:
        assert httpx.post(srv.url + "/completions", json={
            "prompt": [1, 2], "max_tokens": 6, "metadata": {"domain": "code"}},
            timeout=30).status_code == 200
        check(httpx.get(srv.base + "/metrics").text, "the front over vLLM")
    finally:
        srv.stop()
        upstream.stop()


def test_the_dashboard_and_alerts_read_series_draftkits_engine_exports(tiny_models):
    srv = start_server(tiny_models, k=2, max_batch=2, max_tokens_limit=16)
    srv.app.state.metrics.eval_figures({"code": DomainEntry(
        alpha=0.5, tau=None, c=None, k=None, speedup_measured=None, speedup_predicted=None,
        verdict=None)})
    try:
        assert httpx.post(srv.url + "/completions", json={
            "prompt": "def add", "max_tokens": 6, "metadata": {"domain": "code"}},
            timeout=60).status_code == 200
        check(httpx.get(srv.base + "/metrics").text, "draftkit's engine")
    finally:
        srv.stop()
