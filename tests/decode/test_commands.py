"""``draftkit generate`` and ``draftkit bench`` on the tiny saved pair, and their bad input."""

import json

import pytest

from draftkit.cli import main


def run_cli(args, capsys):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_generate_json_per_prompt(tiny_dirs, tmp_path, capsys):
    target, draft = tiny_dirs
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"hello world"\n{"prompt": "the sum of two"}\n'
                       '{"messages": [{"role": "user", "content": "write code"}]}\n')
    code, out, _ = run_cli(["generate", "--target", str(target), "--draft", str(draft),
                            "--k", "2", "--prompts", str(prompts), "--batch-size", "2",
                            "--max-new-tokens", "6", "--json"], capsys)
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 3
    for r in rows:
        assert set(r) == {"text", "new_tokens", "stats"}
        assert set(r["stats"]) == {"target_calls", "drafted", "accepted", "alpha", "tau",
                                   "seconds"}
        assert 1 <= r["new_tokens"] <= 6


def test_generate_plain_and_sampled(tiny_dirs, capsys):
    target, draft = tiny_dirs
    base = ["generate", "--target", str(target), "--prompt", "hello", "--max-new-tokens", "5"]
    code, out, err = run_cli(base, capsys)  # no draft: plain decoding
    assert code == 0 and "target calls" in err
    code, out, _ = run_cli(base + ["--draft", str(draft), "--k", "auto", "--temperature", "0.8",
                                   "--top-p", "0.9", "--top-k", "20", "--raw", "--json"], capsys)
    assert code == 0 and json.loads(out)["new_tokens"] >= 1


@pytest.mark.parametrize("extra,needle", [
    (["--k", "-1"], "--k"),
    (["--k", "lots"], "--k"),
    (["--temperature", "-0.5"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.5"], "--top-p"),
    (["--prompt", " "], "empty prompt"),
    (["--prompt", " ".join(["the"] * 400), "--raw"], "context window"),
])
def test_generate_bad_input_is_one_line(tiny_dirs, capsys, extra, needle):
    target, draft = tiny_dirs
    args = ["generate", "--target", str(target), "--draft", str(draft), "--max-new-tokens", "3"]
    if "--prompt" not in extra:
        args += ["--prompt", "hello"]
    code, _, err = run_cli(args + extra, capsys)
    assert code == 2 and needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_vocab_mismatch_is_a_clear_error(tmp_path, capsys):
    from tests.helpers import make_llama, make_tokenizer, save_model

    tok = make_tokenizer()
    target = save_model(make_llama(len(tok), num_layers=1), tok, tmp_path / "t")
    tok2 = make_tokenizer(extra_words=("zebra",))
    draft = save_model(make_llama(len(tok2), num_layers=1), tok2, tmp_path / "d")
    code, _, err = run_cli(["generate", "--target", str(target), "--draft", str(draft),
                            "--prompt", "hello"], capsys)
    assert code == 2 and ("vocab" in err or "tokenizers differ" in err)
    assert "Traceback" not in err


def test_bench_reports_all_methods(tiny_dirs, tmp_path, capsys):
    target, draft = tiny_dirs
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"hello world"\n"the sum of two"\n')
    code, out, _ = run_cli(["bench", "--target", str(target), "--draft", str(draft),
                            "--prompts", str(prompts), "--k", "2", "--max-new-tokens", "6",
                            "--repeats", "1", "--json"], capsys)
    assert code == 0
    r = json.loads(out)
    assert set(r["tokens_per_s"]) == {"ours_k0", "ours_spec", "hf_generate", "hf_assisted"}
    for key in ("measured_speedup", "predicted_speedup", "measured_over_predicted", "alpha",
                "tau", "c", "v", "k0_over_hf_generate", "spec_over_hf_assisted"):
        assert r[key] is not None, key


def test_prompt_files_that_hold_no_usable_prompt_are_one_clear_error(tmp_path):
    from draftkit.chat import read_prompts
    from draftkit.errors import DraftkitError

    with pytest.raises(DraftkitError, match="is a folder; pass a JSONL file"):
        read_prompts(tmp_path)
    blank = tmp_path / "p.jsonl"
    blank.write_text('"hello"\n{"prompt": ""}\n')
    with pytest.raises(DraftkitError, match=r"p.jsonl:2: expected a non-empty string"):
        read_prompts(blank)
