"""eval/benchmarks/reproduce/drafts_side_by_side.py on tiny models: a standalone draft and an
EAGLE-3 head of one target, measured in one run."""

import json
from pathlib import Path

from tests.helpers import fit_eagle3, load_script, make_llama, make_tokenizer, save_model

SCRIPT = Path(__file__).parents[2] / "eval" / "benchmarks" / "reproduce" / \
    "drafts_side_by_side.py"


def test_a_standalone_draft_and_an_eagle3_head_side_by_side(suite, tmp_path, capsys):
    from tests.helpers import save_head

    tok = make_tokenizer()
    target = make_llama(len(tok), num_layers=4, seed=0)
    save_model(target, tok, tmp_path / "target")
    save_head(fit_eagle3(target, steps=30), tmp_path / "head", tmp_path / "target")
    standalone = save_model(make_llama(len(tok), num_layers=1, seed=3), tok, tmp_path / "d1")
    script = load_script(SCRIPT)
    out = tmp_path / "side"
    assert script.main(["--target", str(tmp_path / "target"), "--draft", f"s={standalone}",
                        "--draft", f"e3={tmp_path / 'head'}", "--suite", str(suite),
                        "--domains", "code,chat", "--k", "2", "--max-new-tokens", "8",
                        "--device", "cpu", "--out", str(out)]) == 0
    rows = json.loads((out / "side_by_side.json").read_text())
    assert [(r["domain"], r["draft"]) for r in rows] == [
        ("code", "s"), ("code", "e3"), ("chat", "s"), ("chat", "e3"),
        ("overall", "s"), ("overall", "e3")]
    for r in rows:
        # each speedup is its prompts' pairs, and its interval holds it
        plain = sum(p[2] for p in r["pairs"]) / sum(p[0] for p in r["pairs"])
        spec = sum(p[3] for p in r["pairs"]) / sum(p[1] for p in r["pairs"])
        assert abs(r["speedup"] - spec / plain) < 1e-9
        assert r["speedup_low"] <= r["speedup"] <= r["speedup_high"]
        assert r["tau"] >= 1 and r["c"] > 0
        if r["domain"] != "overall":  # K = 2 fixed: two draft forwards a round, each a c
            assert abs(r["c_round"] - 2 * r["c"]) < 1e-9 and not r["draft_per_round"]
    by = {(r["domain"], r["draft"]): r for r in rows}
    for domain in ("code", "chat", "overall"):
        # the head over the standalone draft: their two speedups over the same plain decodes
        s, e3 = by[domain, "s"], by[domain, "e3"]
        assert s["vs_first"] is None
        vs = e3["vs_first"]
        assert vs["draft"] == "s" and vs["low"] <= vs["speedup"] <= vs["high"]
        assert abs(vs["speedup"] - e3["speedup"] / s["speedup"]) < 1e-9
    assert all(r["k_used"] == 2 for r in rows if r["domain"] != "overall")
    assert {r["dtype"] for r in rows} == {"float32"}  # auto, on CPU
    assert (out / "speedup.png").is_file()
    assert "| code | e3 | 2 |" in capsys.readouterr().out


def test_a_parallel_head_beside_the_autoregressive_one_drafts_a_round_in_one_forward(
        suite, tmp_path):
    from draftkit.models.eagle3 import from_target, load_eagle3
    from tests.helpers import parallel_head, save_head

    target, target_dir, head_dir = parallel_head(tmp_path)
    ar = from_target(target, load_eagle3(head_dir, target).reduced_head)
    ar_dir = save_head(ar, tmp_path / "ar", target_dir)
    out = tmp_path / "side"
    assert load_script(SCRIPT).main([
        "--target", str(target_dir), "--draft", f"ar={ar_dir}", "--draft", f"p={head_dir}",
        "--suite", str(suite), "--domains", "code", "--k", "3", "--max-new-tokens", "8",
        "--device", "cpu", "--dtype", "bfloat16", "--out", str(out)]) == 0
    rows = json.loads((out / "side_by_side.json").read_text())
    assert {r["dtype"] for r in rows} == {"bfloat16"}  # the target's; heads load in it
    by = {(r["domain"], r["draft"]): r for r in rows}
    ar_row, parallel = by["code", "ar"], by["code", "p"]
    assert not ar_row["draft_per_round"] and abs(ar_row["c_round"] - 3 * ar_row["c"]) < 1e-9
    assert parallel["draft_per_round"] and abs(parallel["c_round"] - parallel["c"]) < 1e-9
    assert parallel["vs_first"]["draft"] == "ar" and parallel["k_used"] == 3


def test_the_round_cost_probe_times_both_heads_per_pending_count(tmp_path, capsys):
    """eval/benchmarks/probes/round_cost.py: a row per pending count, the parallel round
    against one autoregressive step with its interval; counts past K + 1 and heads in each
    other's places are refused."""
    import pytest

    from draftkit.models.eagle3 import from_target, load_eagle3
    from tests.helpers import parallel_head, save_head

    target, target_dir, head_dir = parallel_head(tmp_path)
    ar_dir = save_head(from_target(target, load_eagle3(head_dir, target).reduced_head),
                       tmp_path / "ar", target_dir)
    probe = load_script(Path(__file__).parents[2] / "eval" / "benchmarks" / "probes"
                        / "round_cost.py")
    common = ["--target", str(target_dir), "--k", "3", "--context", "12", "--rounds", "3"]
    for dtype in ("auto", "bfloat16"):  # auto: float32 on CPU
        assert probe.main(["--autoregressive", str(ar_dir), "--parallel", str(head_dir),
                           "--pending", "1", "4", "--dtype", dtype, *common]) == 0
        out = capsys.readouterr().out
        assert (", bfloat16, " if dtype == "bfloat16" else ", float32, ") in out
        rows = [line for line in out.splitlines() if line.startswith(("| 1 |", "| 4 |"))]
        assert len(rows) == 2 and all(line.endswith(") |") and "x (" in line for line in rows)
    for bad in (["--autoregressive", str(ar_dir), "--parallel", str(head_dir), "--pending", "5"],
                ["--autoregressive", str(head_dir), "--parallel", str(ar_dir)]):
        with pytest.raises(SystemExit) as refused:
            probe.main([*bad, *common])
        assert refused.value.code == 2


def test_one_head_as_it_decodes_today_and_with_another_dtype_and_rule(suite, tmp_path, capsys):
    """``NAME=PATH,dtype=D,verify=R``: a draft's own dtype and rule; its speedup is over plain
    decoding in its dtype, decoded in the same rotation; a bad option is one usage error."""
    import pytest

    from tests.helpers import parallel_head

    _, target_dir, head_dir = parallel_head(tmp_path)
    script, out = load_script(SCRIPT), tmp_path / "side"
    common = ["--target", str(target_dir), "--suite", str(suite), "--domains", "code", "--k",
              "2", "--max-new-tokens", "8", "--temperature", "1", "--device", "cpu"]
    assert script.main([*common, "--draft", f"today={head_dir},dtype=float32", "--draft",
                        f"all={head_dir},dtype=bfloat16,verify=block", "--out", str(out)]) == 0
    rows = json.loads((out / "side_by_side.json").read_text())
    by = {(r["domain"], r["draft"]): r for r in rows}
    assert (by["code", "today"]["dtype"], by["code", "today"]["verify"]) == ("float32", "token")
    assert (by["code", "all"]["dtype"], by["code", "all"]["verify"]) == ("bfloat16", "block")
    today, both = by["code", "today"]["pairs"], by["code", "all"]["pairs"]
    # each over its own dtype's plain decodes: the plain timings differ between the two
    assert [p[0] for p in today] != [p[0] for p in both]
    assert by["code", "all"]["vs_first"]["draft"] == "today"
    assert "| bfloat16 | block |" in capsys.readouterr().out
    with pytest.raises(SystemExit) as bad:
        script.main([*common, "--draft", f"x={head_dir},verify=tree", "--out", str(out)])
    assert bad.value.code == 2
