"""serve/load_test.py's repeats: modes in rotated order, medians, and ratios paired by repeat.

The servers and requests are replaced by a stand-in ``run_mode`` whose tokens/s depend on the
mode and the repeat, so the summary's figures can be checked by hand.
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


def test_repeats_rotate_the_modes_and_summarise_medians_and_paired_ratios(load_test, monkeypatch,
                                                                         capsys):
    # tokens/s: off 100; K 1 90 at concurrency 1 and 50 at 4; auto tracks off within a slow
    # second repeat that slows every mode alike (so only a paired ratio sees it as 0.98)
    speed = {"off": {1: 100.0, 4: 200.0}, "1": {1: 90.0, 4: 50.0}, "auto": {1: 98.0, 4: 196.0}}
    order = []

    def run_mode(args, mode, prompts, levels):
        order.append(mode)
        slow = 0.5 if len(order) in (4, 5, 6) else 1.0  # the whole second repeat
        return {c: {"tokens_per_s": speed[mode][c] * slow, "p50": 1.0, "p99": 2.0,
                    "tau": 1.0, "k": 0.0} for c in levels}

    monkeypatch.setattr(load_test, "run_mode", run_mode)
    load_test.main(["--target", "t", "--modes", "off,1,auto", "--repeats", "3",
                    "--concurrency", "1,4"])
    assert order == ["off", "1", "auto", "1", "auto", "off", "auto", "off", "1"]
    out = capsys.readouterr().out
    summary = out[out.index("median tokens/s"):]
    assert "| off | 1 | 100.0 |  | 1.111 (1.111-1.111) (K 1) |" in summary
    assert "| auto | 1 | 98.0 | 0.980 (0.980-0.980) | 1.089 (1.089-1.089) (K 1) |" in summary
    assert "| auto | 4 | 196.0 | 0.980 (0.980-0.980) | 3.920 (3.920-3.920) (K 1) |" in summary
    assert "| 1 | 4 | 50.0 | 0.250 (0.250-0.250) |  |" in summary  # K 1 is the best fixed K


def test_a_bad_prompts_file_is_one_line(load_test, tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_bytes(b'{"prompt": "a"}\n\xff\xfe\n')
    with pytest.raises(SystemExit) as e:
        load_test.main(["--target", "t", "--prompts", str(bad)])
    assert str(e.value).startswith("load_test: ") and "UTF-8" in str(e.value)
    with pytest.raises(SystemExit):
        load_test.main(["--target", "t", "--repeats", "0"])
