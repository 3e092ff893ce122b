"""The distillation benchmark scripts in eval/benchmarks end to end on tiny random models."""

import json
import random
from pathlib import Path

import pytest

from tests.helpers import ROW_WORDS, load_script, tiny_recipe

BENCHMARKS = Path(__file__).resolve().parents[2] / "eval" / "benchmarks"


def test_every_cell_is_trained_and_scored_on_one_heldout_set(tmp_path, tiny_dirs):
    mod = load_script(BENCHMARKS / "reproduce" / "loss_regime_table.py")
    recipe, prompts = tiny_recipe(tmp_path, tiny_dirs[0])
    rng = random.Random(1)
    text = tmp_path / "text.jsonl"
    text.write_text("".join(json.dumps({"text": " ".join(rng.choices(ROW_WORDS, k=30)),
                                        "domain": "code"}) + "\n" for _ in range(10)))
    out = tmp_path / "table"
    assert mod.main(["--recipe", str(recipe), "--prompts", str(prompts), "--fixed-text",
                     str(text), "--steps", "2", "--losses", "fkl", "tvd", "--out",
                     str(out)]) == 0
    table = json.loads((out / "table.json").read_text())
    assert set(table["cells"]) == {f"{loss}-{r}" for loss in ("fkl", "tvd")
                                   for r in ("fixed", "target", "on_policy")}
    assert all(0.0 <= c["alpha"] <= 1.0 for c in table["cells"].values())
    assert (out / "table.png").is_file() and "| fkl |" in (out / "table.md").read_text()
    assert (out / "tvd-on_policy" / "best" / "model.safetensors").is_file()


def test_acceptance_by_entropy_buckets_add_up_to_heldout_alpha(tmp_path, tiny_dirs, capsys):
    import torch

    from draftkit.distill.evaluate import heldout_alpha, model_logits

    mod = load_script(BENCHMARKS / "reproduce" / "acceptance_by_entropy.py")
    recipe, _ = tiny_recipe(tmp_path, tiny_dirs[0])
    args = mod.argparse.Namespace(recipe=recipe, set=[], device="cpu", train_rows=4)
    _, target, sample, heldout = mod.load(args)
    assert len(sample) <= 4 and sample.domains == heldout.domains
    torch.manual_seed(0)
    draft = type(target)(target.config).eval()  # a random draft: acceptance well below 1
    d_fn, t_fn = model_logits(draft, "cpu"), model_logits(target, "cpu")
    by_bucket, per_row = mod.by_entropy(d_fn, t_fn, heldout, 4)
    buckets = by_bucket["code"]
    count = sum(c for _, _, c, _ in buckets)
    assert count == int(heldout.loss_mask.sum())
    weighted = sum(c * a for _, _, c, a in buckets if c) / count
    assert abs(weighted - heldout_alpha(d_fn, t_fn, heldout, 4)["alpha/code"]) < 1e-6
    assert mod.bucket_alpha(buckets) == weighted
    assert len(per_row) == len(heldout) and abs(sum(per_row) / count - weighted) < 1e-6
    same, same_rows = mod.by_entropy(t_fn, t_fn, heldout, 4)  # the target as its own draft
    assert all(abs(a - 1.0) < 1e-5 for _, _, c, a in same["code"] if c)
    # The target against the random draft as control: the margin is 1 - alpha, and with every
    # row far ahead the interval stays above 0.
    header, _, cell = mod.margins({"t": same_rows, "d": per_row}, ["t"], "d", heldout)
    assert header == f"| draft | code ({len(heldout)} rows) |"
    delta, lo, hi = (float(x) for x in cell.split("|")[2].replace("[", " ").replace("]", " ")
                     .replace(",", " ").split())
    assert abs(delta - (1 - weighted)) < 6e-4 and 0 < lo <= delta <= hi  # printed to 3 places

    draft_dir = tmp_path / "draft"
    draft.save_pretrained(draft_dir)
    out = tmp_path / "entropy"
    assert mod.main(["--recipe", str(recipe), "--drafts", str(draft_dir), "--control",
                     str(draft_dir), "--train-rows", "4", "--out", str(out)]) == 0
    text = (out / "acceptance_by_entropy.md").read_text()
    assert "code train" in text and "held-out acceptance by target entropy" in text
    # A draft against itself: a margin of exactly 0, and so an interval of exactly 0.
    assert f"| {draft_dir} | +0.000 [+0.000, +0.000] |" in text
    assert text in capsys.readouterr().out

    # A draft with a reduced head is scored on it, or with --whole-head on all of its head.
    from draftkit.models.reduced_head import ReducedHead

    v = target.config.vocab_size
    head = ReducedHead(range(0, v, 3), v, 0.5, "test")
    head.save(draft_dir)
    scored = {}
    for flag in ([], ["--whole-head"]):
        mod.main(["--recipe", str(recipe), "--drafts", str(draft_dir), "--train-rows", "4",
                  *flag])
        row = next(x for x in capsys.readouterr().out.splitlines()
                   if x.startswith(f"| {draft_dir}"))
        scored[bool(flag)] = float(row.split("|")[3])  # code held-out
    reduced = model_logits(draft, "cpu", head=head)
    want = heldout_alpha(reduced, t_fn, heldout, 4)
    assert abs(scored[False] - want["alpha/code"]) < 6e-4
    assert abs(scored[True] - weighted) < 6e-4 and abs(scored[True] - scored[False]) > 1e-2


def test_quality_bar_is_judged_on_the_drafts_each_run_keeps(tmp_path, capsys):
    """A control that peaks early ships its peak: the margin is taken against that, not against
    its later, overfitted evaluations."""
    quality = load_script(BENCHMARKS / "reproduce" / "distill_quality.py")

    def run(name, curve):
        d = tmp_path / name
        (d / "best").mkdir(parents=True)
        rows = [{"step": 40 * i, "minutes": 6.0 * i, "alpha/code": a, "alpha/math": a,
                 "alpha": a} for i, a in enumerate(curve)]
        d.joinpath("metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        best = max(rows, key=lambda r: r["alpha"])
        d.joinpath("best", "best.json").write_text(json.dumps(best))
        return d

    recipe = run("fkl", [0.0, 0.30, 0.40, 0.45])
    control = run("ce", [0.0, 0.36, 0.33, 0.30])
    cmp_ = quality.compare(quality.read_metrics(recipe), quality.read_metrics(control),
                           (quality.read_best(recipe), quality.read_best(control)), 0.1)
    assert cmp_["last"]["steps"] == (120, 120) and cmp_["last"]["passed"]
    assert cmp_["best"]["steps"] == (120, 40)
    assert abs(cmp_["best"]["domains"]["code"]["delta"] - 0.09) < 1e-9
    assert not cmp_["passed"]
    assert quality.main(["--run", str(recipe), "--control", str(control),
                         "--out", str(tmp_path / "q")]) == 0
    assert "best against best): NOT met" in capsys.readouterr().out


def test_ttt_heads_are_scored_at_the_same_positions_as_their_training_scores_them(tmp_path,
                                                                                   tiny_dirs):
    """Every head is scored K = --positions deep on the recipe's held-out rows; the head
    trained with that many steps gets the tau its own run chose it by (same rows, same
    evaluation), and the one trained with fewer gets positions its run never scored."""
    mod = load_script(BENCHMARKS / "reproduce" / "ttt_steps_table.py")
    recipe, _ = tiny_recipe(tmp_path, tiny_dirs[0])
    out = tmp_path / "ttt"
    head = ["draft.kind=eagle3", "draft.derive_layers=null", "draft.draft_vocab_size=40"]
    assert mod.main(["--recipe", str(recipe), "--ttt", "2", "1", "--steps", "2",
                     "--positions", "2", "--out", str(out), "--set", *head]) == 0
    cells = json.loads((out / "table.json").read_text())["cells"]
    assert list(cells) == ["1", "2"]
    for ttt, cell in cells.items():
        figures = cell["figures"]
        assert {"alpha_1", "alpha_2", "tau/code"} <= set(figures)
        assert 1.0 <= figures["tau"] <= 3.0 and cell["minutes"] > 0
    chose = json.loads((out / "ttt-2" / "best" / "best.json").read_text())
    assert cells["2"]["figures"]["tau"] == pytest.approx(chose["tau"], abs=1e-6)
    assert "alpha_2" not in json.loads((out / "ttt-1" / "best" / "best.json").read_text())
    assert (out / "table.png").is_file() and "| 2 |" in (out / "table.md").read_text()
