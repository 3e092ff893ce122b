"""The target-forward timing scripts on a tiny target: verify_cost.py (T(n) / T(1) per dtype, the
dtypes timed in the same rounds) and probes/wide_products.py (wide products in their measured
form against F.linear)."""

from pathlib import Path

import pytest

from tests.helpers import load_script, make_llama, make_tokenizer, save_model

BENCHMARKS = Path(__file__).parents[2] / "eval" / "benchmarks"
SCRIPT = BENCHMARKS / "reproduce" / "verify_cost.py"


def test_two_dtypes_are_timed_side_by_side_with_the_plain_steps_ratio(tmp_path, capsys):
    tok = make_tokenizer()
    target = save_model(make_llama(len(tok), num_layers=2, seed=0), tok, tmp_path / "target")
    script = load_script(SCRIPT)
    common = ["--target", str(target), "--device", "cpu", "--context", "8", "--max-tokens",
              "3", "--repeats", "3"]
    assert script.main([*common, "--dtype", "float32", "bfloat16"]) == 0
    out = capsys.readouterr().out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith(("| 1 ", "| 3 "))]
    assert len(rows) == 2 and all(len(r) == 5 for r in rows)  # n, then ms and T(n)/T(1) each
    assert rows[0][2] == "1.00" and rows[0][4].rstrip(" |") == "1.00"  # T(1) / T(1)
    assert "float32 median ms" in out and "bfloat16 T(n) / T(1)" in out
    assert "plain step time, bfloat16 / float32: " in out and "(95% " in out
    for bad in (["--dtype", "float32", "float32"], ["--dtype", "auto", "float32"]):
        with pytest.raises(SystemExit) as refused:  # auto is float32 on a CPU
            script.main([*common, *bad])
        assert refused.value.code == 2


def test_the_wide_products_probe_times_each_shape_both_ways(tmp_path, capsys, monkeypatch):
    from draftkit.decode import cpu_linear

    monkeypatch.setattr(cpu_linear, "MIN_TUNE_BYTES", 0)  # a tiny target measured as a large one
    monkeypatch.setattr(cpu_linear, "_tuned", {})
    tok = make_tokenizer()
    target = save_model(make_llama(len(tok), num_layers=2, seed=0), tok, tmp_path / "target")
    probe = load_script(BENCHMARKS / "probes" / "wide_products.py")
    common = ["--target", str(target), "--context", "8", "--rounds", "3"]
    assert probe.main([*common, "--shapes", "1x1", "2x5", "--prefill", "12"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("| 1 | 1 |", "| 2 | 5 |",
                                                                   "| 1 | 12 |"))]
    assert len(rows) == 3 and all(line.endswith(") |") for line in rows)
    assert "the target's head took " in out
    for bad in (["--shapes", "2by5"], ["--shapes", "0x3"]):
        with pytest.raises(SystemExit) as refused:
            probe.main([*common, *bad])
        assert refused.value.code == 2
