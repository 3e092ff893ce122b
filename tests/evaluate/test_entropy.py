"""Acceptance by the target's entropy: buckets, means and merging across domains."""

import math

import pytest
import torch

from draftkit.evaluate.entropy import EDGES, EntropyBuckets, bucket_index, label, merge


def test_bucket_edges_are_closed_below_open_above():
    h = torch.tensor([0.0, 0.09, 0.1, 0.49, 0.5, 1.0, 1.99, 2.0, 50.0])
    assert bucket_index(h).tolist() == [0, 0, 1, 1, 2, 3, 3, 4, 4]
    assert [label(b) for b in range(len(EDGES) - 1)] == \
        ["[0, 0.1)", "[0.1, 0.5)", "[0.5, 1)", "[1, 2)", ">= 2"]


def test_means_per_bucket_and_merge_equals_one_pass():
    g = torch.Generator().manual_seed(0)
    h = torch.rand(200, generator=g) * 3  # (N,) nats
    a = torch.rand(200, generator=g)  # (N,) acceptance
    whole = EntropyBuckets(["draft"])
    whole.add(h, {"draft": a})
    r = whole.result()
    b = bucket_index(h.double())
    for i in range(len(EDGES) - 1):
        assert r.positions[i] == int((b == i).sum())
        assert r.acceptance["draft"][i] == pytest.approx(float(a.double()[b == i].mean()))
    assert whole.entropy_sum == pytest.approx(float(h.double().sum()))
    halves = []
    for part in (slice(0, 70), slice(70, 200)):
        eb = EntropyBuckets(["draft"])
        eb.add(h[part], {"draft": a[part]})
        halves.append(eb.result())
    merged = merge(halves)
    assert merged.positions == r.positions
    assert merged.acceptance["draft"] == pytest.approx(r.acceptance["draft"])


def test_an_empty_bucket_has_no_mean():
    eb = EntropyBuckets(["draft"])
    eb.add(torch.tensor([0.0, 0.05]), {"draft": torch.tensor([1.0, 0.0])})
    r = eb.result()
    assert r.positions == [2, 0, 0, 0, 0]
    assert r.acceptance["draft"][0] == 0.5 and r.acceptance["draft"][1:] == [None] * 4
    merged = merge([r, r]).acceptance["draft"]
    assert merged[1] is None and not math.isnan(merged[0])
