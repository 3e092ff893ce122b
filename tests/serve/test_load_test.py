"""serve/load_test.py: modes taking turns per level, medians, and ratios paired by repeat.

The servers and requests are replaced by stand-ins (``start_server``, ``measure``) whose
tokens/s depend on the mode and the repeat, so the summary's figures can be checked by hand.
"""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "serve" / "load_test.py"


@pytest.fixture
def load_test():
    spec = importlib.util.spec_from_file_location("load_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_modes_take_turns_per_level_and_the_summary_pairs_them_by_repeat(load_test,
                                                                         monkeypatch, capsys):
    # tokens/s: off 100; K 1 90 at concurrency 1 and 50 at 4; auto tracks off within a slow
    # second repeat that slows every mode alike (so only a paired ratio sees it as 0.98)
    speed = {"off": {1: 100.0, 4: 200.0}, "1": {1: 90.0, 4: 50.0}, "auto": {1: 98.0, 4: 196.0}}
    order, stopped = [], []

    def measure(args, url, prompts, concurrency, requests):
        order.append((url, concurrency, requests))
        timed = [o for o in order if o[2] == args.requests]
        slow = 0.5 if 7 <= len(timed) <= 12 else 1.0  # the whole second repeat
        return {"tokens_per_s": speed[url][concurrency] * slow, "p50": 1.0, "p99": 2.0,
                "tau": 1.0, "k": 0.0}

    monkeypatch.setattr(load_test, "start_server", lambda args, k: (k, "off" if k == "0" else k))
    monkeypatch.setattr(load_test, "stop_server", stopped.append)
    monkeypatch.setattr(load_test, "measure", measure)
    load_test.main(["--target", "t", "--modes", "off,1,auto", "--repeats", "3",
                    "--concurrency", "1,4", "--requests", "8"])
    # each server warmed up once; then per repeat and level every mode once, rotated
    assert [o[0] for o in order[:3]] == ["off", "1", "auto"] and \
        {o[2] for o in order[:3]} == {4}
    assert [(u, c) for u, c, _ in order[3:]] == [
        ("off", 1), ("1", 1), ("auto", 1), ("1", 4), ("auto", 4), ("off", 4),
        ("1", 1), ("auto", 1), ("off", 1), ("auto", 4), ("off", 4), ("1", 4),
        ("auto", 1), ("off", 1), ("1", 1), ("off", 4), ("1", 4), ("auto", 4)]
    assert sorted(stopped) == ["0", "1", "auto"]  # every server stopped
    out = capsys.readouterr().out
    summary = out[out.index("median tokens/s"):]
    assert "| off | 1 | 100.0 |  | 1.111 (1.111-1.111) (K 1) |" in summary
    assert "| auto | 1 | 98.0 | 0.980 (0.980-0.980) | 1.089 (1.089-1.089) (K 1) |" in summary
    assert "| auto | 4 | 196.0 | 0.980 (0.980-0.980) | 3.920 (3.920-3.920) (K 1) |" in summary
    assert "| 1 | 4 | 50.0 | 0.250 (0.250-0.250) |  |" in summary  # K 1 is the best fixed K


def test_servers_already_started_are_stopped_when_one_fails_to_start(load_test, monkeypatch):
    started, stopped = [], []

    def start_server(args, k):
        if k == "auto":
            raise SystemExit("the server did not come up in time")
        started.append(k)
        return k, k

    monkeypatch.setattr(load_test, "start_server", start_server)
    monkeypatch.setattr(load_test, "stop_server", stopped.append)
    with pytest.raises(SystemExit, match="did not come up"):
        load_test.main(["--target", "t", "--modes", "off,1,auto"])
    assert stopped == started == ["0", "1"]


def test_a_bad_prompts_file_is_one_line(load_test, tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_bytes(b'{"prompt": "a"}\n\xff\xfe\n')
    with pytest.raises(SystemExit) as e:
        load_test.main(["--target", "t", "--prompts", str(bad)])
    assert str(e.value).startswith("load_test: ") and "UTF-8" in str(e.value)
    with pytest.raises(SystemExit):
        load_test.main(["--target", "t", "--repeats", "0"])
