"""``/metrics``: the per-position accepted-token series as vLLM exposes them (labels
model_name, engine, position; positions 0..K-1 at zero before any request)."""

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import start_server

PER_POS = "draftkit:spec_decode_num_accepted_tokens_per_pos"


def samples(base: str, family: str) -> list:
    """The ``_total`` samples of one counter family on the live server."""
    text = httpx.get(f"{base}/metrics").text
    return [s for f in text_string_to_metric_families(text) if f.name == family
            for s in f.samples if s.name == family + "_total"]


def test_positions_exist_from_start_up_with_vllms_labels(tiny_models):
    """Fixed K = 3: positions 0, 1, 2 at zero before any request, labelled as vLLM labels
    them; after requests they sum to the accepted total and no other position appears."""
    srv = start_server(tiny_models, k=3, max_batch=2)
    try:
        before = samples(srv.base, PER_POS)
        assert [s.labels for s in before] == [
            {"model_name": "tiny", "engine": "0", "position": str(i)} for i in range(3)]
        assert [s.value for s in before] == [0.0, 0.0, 0.0]
        drafts = samples(srv.base, "draftkit:spec_decode_num_drafts")
        assert [s.labels for s in drafts] == [{"model_name": "tiny", "engine": "0"}]
        c = srv.client()
        for prompt in ("hello world", "the sum of two"):
            c.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0)
        after = samples(srv.base, PER_POS)
        accepted = samples(srv.base, "draftkit:spec_decode_num_accepted_tokens")[0].value
        assert [s.labels["position"] for s in after] == ["0", "1", "2"]
        assert accepted > 0 and sum(s.value for s in after) == accepted
        # a position is reached only by rounds that accepted every earlier one
        assert after[0].value >= after[1].value >= after[2].value
    finally:
        srv.stop()


def test_k_auto_opens_k_max_positions(tiny_models):
    """--k auto varies K round by round: the series span K-max, the most a round drafts."""
    srv = start_server(tiny_models, k="auto", k_max=5, max_batch=2)
    try:
        assert [s.labels["position"] for s in samples(srv.base, PER_POS)] == [
            "0", "1", "2", "3", "4"]
    finally:
        srv.stop()


def test_no_draft_no_positions(tiny_models):
    """Plain decoding drafts nothing: no per-position series (and no crash rendering)."""
    srv = start_server(tiny_models, k=0, max_batch=2)
    try:
        assert samples(srv.base, PER_POS) == []
        srv.client().completions.create(model="tiny", prompt="hello", max_tokens=4)
        assert samples(srv.base, PER_POS) == []
    finally:
        srv.stop()
