"""Public benchmarks' question files as suites, in the shapes their projects publish: MT-Bench's
and Spec-Bench's question.jsonl, HumanEval's gzipped JSONL, GSM8K's JSONL; and an eval report
that names the benchmark and its categories as domains."""

import gzip
import json
import re

import pytest

from draftkit.errors import DraftkitError
from draftkit.evaluate import by_domain, load_suite
from draftkit.evaluate.suite import MT_BENCH_CATEGORIES, benchmark_of, with_later_turns

SPEC_BENCH_OWN = ("translation", "summarization", "qa", "math_reasoning", "rag")


def _question(qid: int, category: str, turns: int) -> dict:
    """A row as MT-Bench's and Spec-Bench's question.jsonl hold it (math, reasoning and coding
    questions, and some of Spec-Bench's own, carry reference answers)."""
    row = {"question_id": qid, "category": category,
           "turns": [f"write {category} question {qid} turn {t + 1}" for t in range(turns)]}
    if category in ("math", "reasoning", "coding", "translation", "math_reasoning"):
        row["reference"] = [f"reference {t + 1}" for t in range(turns)]
    return row


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def mt_bench(path, per_category: int = 2):
    """MT-Bench's question.jsonl: question ids from 81, two turns each, its eight categories
    in its order."""
    rows = [_question(81 + 10 * c + i, cat, 2) for c, cat in enumerate(MT_BENCH_CATEGORIES)
            for i in range(per_category)]
    return _write(path, rows)


def spec_bench(path, per_category: int = 2):
    """Spec-Bench's question.jsonl: MT-Bench's questions first, then its own categories, one
    turn each."""
    rows = [_question(81 + 10 * c + i, cat, 2) for c, cat in enumerate(MT_BENCH_CATEGORIES)
            for i in range(per_category)]
    rows += [_question(161 + 80 * c + i, cat, 1) for c, cat in enumerate(SPEC_BENCH_OWN)
             for i in range(per_category)]
    return _write(path, rows)


def test_mt_bench_and_spec_bench_read_their_first_turns_by_category(tmp_path):
    (tmp_path / "mt_bench").mkdir()
    rows = load_suite(mt_bench(tmp_path / "mt_bench" / "question.jsonl"))
    assert list(by_domain(rows)) == list(MT_BENCH_CATEGORIES)
    assert rows[0].prompt == "write writing question 81 turn 1" and rows[0].source.endswith(":1")
    assert benchmark_of(rows) == "MT-Bench (first turns)"
    (tmp_path / "spec").mkdir()
    rows = load_suite(spec_bench(tmp_path / "spec" / "question.jsonl"))
    assert list(by_domain(rows)) == [*MT_BENCH_CATEGORIES, *SPEC_BENCH_OWN]
    assert benchmark_of(rows) == "Spec-Bench (first turns)"
    assert [r.prompt for r in load_suite(tmp_path / "spec", domains=["rag"])] == [
        "write rag question 481 turn 1", "write rag question 482 turn 1"]
    # Spec-Bench's own part alone has single turns
    only = _write(tmp_path / "own.jsonl", [_question(161, "qa", 1)])
    assert benchmark_of(load_suite(only)) == "Spec-Bench"


def test_later_turns_follow_the_targets_answers_to_the_turns_before(tmp_path):
    rows = load_suite(_write(tmp_path / "q.jsonl", [
        _question(81, "writing", 2), _question(82, "stem", 3), _question(161, "qa", 1)]))
    asked = []

    def answer(chats):
        asked.append(chats)
        return [f"answer {len(asked)}.{i}" for i in range(len(chats))]

    out = with_later_turns(rows, answer)
    assert [len(a) for a in asked] == [2, 1]  # a call a turn: both questions, then the stem one
    assert out[:3] == rows and [r.source.rpartition("/")[2] for r in out[3:]] == [
        "q.jsonl:1 turn 2", "q.jsonl:2 turn 2", "q.jsonl:2 turn 3"]
    assert [m["content"] for m in out[-1].prompt] == [
        "write stem question 82 turn 1", "answer 1.1", "write stem question 82 turn 2",
        "answer 2.0", "write stem question 82 turn 3"]
    assert [r.domain for r in out[3:]] == ["writing", "stem", "stem"]
    assert benchmark_of(out, every_turn=True) == "Spec-Bench (every turn)"


def test_humaneval_and_gsm8k_as_their_projects_ship_them(tmp_path):
    humaneval = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(humaneval, "wt") as f:
        for i in range(3):
            f.write(json.dumps({"task_id": f"HumanEval/{i}",
                                "prompt": f"def f{i}(x):\n    \"\"\"Return x.\"\"\"\n",
                                "canonical_solution": "    return x\n",
                                "test": "def check(candidate):\n    assert candidate(1) == 1\n",
                                "entry_point": f"f{i}"}) + "\n")
    gsm8k = _write(tmp_path / "test.jsonl", [
        {"question": f"Ann has {i} apples. How many?", "answer": f"She has {i}.\n#### {i}"}
        for i in range(2)])
    rows = load_suite(tmp_path)  # a folder of both, gzipped files included
    assert [(r.domain, r.benchmark) for r in rows] == [("code", "HumanEval")] * 3 + \
        [("math", "GSM8K")] * 2
    assert rows[0].prompt.startswith("def f0(x):")
    assert rows[3].prompt == "Ann has 0 apples. How many?"
    assert benchmark_of(rows) == "HumanEval + GSM8K"
    assert benchmark_of(load_suite(gsm8k)) == "GSM8K"
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(b"not gzip")
    with pytest.raises(DraftkitError, match="broken.jsonl.gz is not whole gzip data"):
        load_suite(broken)


@pytest.mark.parametrize("rows, said", [
    ([{"question_id": 1, "category": "writing", "turns": []}], "'turns' must be a non-empty"),
    ([{"question_id": 1, "category": "", "turns": ["x"]}], "missing or empty 'category'"),
    ([{"task_id": "HumanEval/0", "prompt": "", "entry_point": "f"}], "missing or empty 'prompt'"),
    ([{"question": "2 + 2?", "answer": "4"}, {"domain": "math", "prompt": "3 + 3?"}],
     "a draftkit row in a gsm8k file"),
    ([{"id": 1, "query": "x"}], "a row of no suite shape draftkit reads (keys id, query); give "
                                "draftkit's own")])
def test_bad_benchmark_rows_name_their_line(tmp_path, rows, said):
    path = _write(tmp_path / "q.jsonl", rows)
    with pytest.raises(DraftkitError, match=re.escape(f"{path}:{len(rows)}: {said}")):
        load_suite(path)


def test_eval_on_mt_bench_and_spec_bench_names_the_benchmark_and_its_categories(tiny_dirs,
                                                                                tmp_path):
    from draftkit.evaluate.args import EvalArgs
    from draftkit.evaluate.command import evaluate

    target, draft = tiny_dirs
    for write, name, categories in (
            (mt_bench, "MT-Bench", MT_BENCH_CATEGORIES),
            (spec_bench, "Spec-Bench", (*MT_BENCH_CATEGORIES, *SPEC_BENCH_OWN))):
        (tmp_path / name).mkdir()
        suite = write(tmp_path / name / "question.jsonl", per_category=1)
        out = tmp_path / name / "out"
        report = evaluate(EvalArgs(target=str(target), draft=str(draft), suite=str(suite),
                                   out=str(out), k=2, max_new_tokens=4, k_sweep=[],
                                   batch_sizes=[]))
        assert report.benchmark == f"{name} (first turns)"
        assert list(report.domains) == list(categories)
        assert json.loads((out / "report.json").read_text())["benchmark"] == report.benchmark
        header = (out / "report.md").read_text().splitlines()[2]
        assert header == f"benchmark {name} (first turns)"
    # every turn: each question's second turn after the target's answer to its first
    report = evaluate(EvalArgs(target=str(target), draft=str(draft),
                               suite=str(tmp_path / "MT-Bench" / "question.jsonl"),
                               out=str(tmp_path / "every"), k=2, max_new_tokens=4, k_sweep=[],
                               batch_sizes=[], turns="every"))
    assert report.benchmark == "MT-Bench (every turn)"
    assert [d.n_prompts for d in report.domains.values()] == [2] * 8
