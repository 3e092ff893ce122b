"""``draftkit traffic --prometheus URL``: a vLLM fleet's own counters, read from a stand-in
Prometheus query API, summed and turned into tau, alpha and alpha_i as draftkit defines them."""

from __future__ import annotations

import pytest
from fastapi import FastAPI

from draftkit.errors import ConfigError, DraftkitError
from draftkit.traffic.args import TrafficArgs
from draftkit.traffic.command import traffic
from draftkit.traffic.fleet import fleet_figures
from tests.helpers import LiveServer

# two servers' counters: 100 speculative steps of K 3 in all
SERVERS = [{"drafts": 60, "draft_tokens": 180, "accepted": 90, "pos": [42, 30, 18]},
           {"drafts": 40, "draft_tokens": 120, "accepted": 60, "pos": [28, 20, 12]}]

NAMES = {"vllm:spec_decode_num_drafts_total": "drafts",
         "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
         "vllm:spec_decode_num_accepted_tokens_total": "accepted"}


def stand_in(drafts: bool = True) -> LiveServer:
    """Prometheus's /api/v1/query over SERVERS' counters (sums, by position); records each
    query."""
    app = FastAPI()
    app.state.queries = []

    @app.get("/api/v1/query")
    async def query(query: str):
        app.state.queries.append(query)
        if "sum by (position)" in query:
            result = [{"metric": {"position": str(i)},
                       "value": [0, str(sum(s["pos"][i] for s in SERVERS))]} for i in range(3)]
        else:
            key = next(k for name, k in NAMES.items() if name in query)
            total = sum(s[key] for s in SERVERS) if drafts else 0
            result = [{"metric": {}, "value": [0, str(total)]}]
        return {"status": "success", "data": {"resultType": "vector", "result": result}}

    return LiveServer(app)


def test_the_fleets_counters_give_tau_alpha_and_alpha_i():
    srv = stand_in()
    try:
        fleet = fleet_figures(srv.base, window="1h", selector='model_name="m"')
        queries = srv.app.state.queries
    finally:
        srv.stop()
    assert fleet.drafts == 100 and fleet.accepted == 150 and fleet.accepted_per_pos == [70, 50,
                                                                                        30]
    assert fleet.tau == pytest.approx(2.5) and fleet.acceptance_rate == pytest.approx(0.5)
    # a step tests position 1 always, position i+1 where it kept position i
    assert fleet.alpha == pytest.approx(150 / (100 + 70 + 50))
    assert fleet.alpha_per_position == pytest.approx([0.7, 50 / 70, 30 / 50])
    assert all('[1h])' in q and 'model_name="m"' in q for q in queries), queries


def test_the_command_prints_the_fleet_beside_nothing_else(capsys):
    srv = stand_in()
    try:
        args = TrafficArgs(prometheus=srv.base)
        args.validate()
        traffic(args)
    finally:
        srv.stop()
    said = capsys.readouterr().out
    assert "since each server started: 100 speculative steps" in said
    assert "tau 2.500; alpha 0.682" in said and "alpha_i 0.700 / 0.714 / 0.600" in said


def test_a_fleet_without_speculation_or_prometheus_is_one_line():
    srv = stand_in(drafts=False)
    try:
        with pytest.raises(DraftkitError, match="no speculative steps"):
            fleet_figures(srv.base)
    finally:
        srv.stop()
    with pytest.raises(DraftkitError, match="does not answer its query API"):
        fleet_figures("http://127.0.0.1:9")


@pytest.mark.parametrize("flags,says", [
    (dict(), "give the traffic folder"),
    (dict(folder="d", window="1h"), "--window and --selector are for --prometheus"),
    (dict(prometheus="http://p", window="an hour"), "is not a PromQL range"),
    (dict(prometheus="http://p", domain="code"), "--domain picks a label"),
])
def test_the_fleet_flags_are_checked(flags, says):
    with pytest.raises(ConfigError, match=says):
        TrafficArgs(**flags).validate()
