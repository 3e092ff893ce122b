"""Loading, chat rendering, response-only masks, packing and the generation cache, on tiny files."""

import copy
import gzip
import json
import re
from unittest import mock

import pandas as pd
import pytest
import torch

from draftkit.data import build_rows, load_examples, pack, split_heldout, tokenize_example
from draftkit.data.generate import generate_responses, read_cache
from draftkit.config import from_dict
from draftkit.distill.config import DataSection, DataSource
from draftkit.errors import DraftkitError
from tests.helpers import make_llama, make_tokenizer


@pytest.fixture
def tok():
    return make_tokenizer()


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_formats_and_domains(tmp_path):
    j = _jsonl(tmp_path / "a.jsonl", [{"prompt": "what is 2 + 2 ?", "response": "4",
                                        "domain": "math"},
                                       {"messages": [{"role": "user", "content": "hello"},
                                                     {"role": "assistant", "content": "hi"}],
                                        "domain": "chat"}])
    pd.DataFrame({"text": ["def x ( ) : return 1", "import y"]}).to_parquet(tmp_path / "b.parquet")
    source = "def f():\n    return 1\n\n\ndef g():\n\n    return 2\n"
    (tmp_path / "c.txt").write_text(source)
    (tmp_path / "d.txt").write_text("the water is long\nhow do you do\n")
    by = load_examples([DataSource(path=str(j)),
                        DataSource(path=str(tmp_path / "b.parquet"), domain="code", max_rows=1),
                        DataSource(path=str(tmp_path / "*.txt"), domain="prose")])
    assert {d: len(v) for d, v in by.items()} == {"math": 1, "chat": 1, "code": 1, "prose": 2}
    # a text file is one document, blank lines and newlines kept (not a row per line)
    assert sorted(ex.text for ex in by["prose"]) == \
        sorted([source, "the water is long\nhow do you do\n"])
    assert by["chat"][0].response == "hi" and by["chat"][0].messages[-1]["role"] == "user"


def _no_rows(path):
    return re.escape(f"{path} has no rows; give a non-empty data file")


@pytest.mark.parametrize("name,content", [("e.jsonl", ""), ("e.parquet", ""), ("e.txt", ""),
                                          ("blank.jsonl", "\n \n\n"), ("blank.txt", " \n\n")])
def test_empty_files_say_so(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DraftkitError, match=_no_rows(path)):
        load_examples([DataSource(path=str(path), domain="x")])


def test_empty_parquet_globs_and_compressed_files_say_so(tmp_path, capfd, caplog):
    pd.DataFrame({"text": pd.Series([], dtype=str)}).to_parquet(tmp_path / "zero.parquet")
    (tmp_path / "e.parquet").write_bytes(b"")
    with gzip.open(tmp_path / "blank.jsonl.gz", "wt") as f:
        f.write("\n\n")
    for path in (tmp_path / "zero.parquet", tmp_path / "*.parquet", tmp_path / "blank.jsonl.gz"):
        with pytest.raises(DraftkitError, match=_no_rows(path)):
            load_examples([DataSource(path=str(path), domain="x")])
    assert "Failed to read" not in capfd.readouterr().err + caplog.text  # no datasets log line
    # a glob with one non-empty file, and a non-empty compressed file, still load
    _jsonl(tmp_path / "full.jsonl", [{"text": "hello"}])
    (tmp_path / "e.jsonl").write_text("")
    with gzip.open(tmp_path / "full.jsonl.gz", "wt") as f:
        f.write('{"text": "hi"}\n')
    pd.DataFrame({"text": ["x = 1"]}).to_parquet(tmp_path / "full.parquet")
    (tmp_path / "sub.jsonl").mkdir()  # a glob may match a folder too: it is not a data file
    for path in (tmp_path / "*.jsonl", tmp_path / "full.jsonl.gz", tmp_path / "*.parquet"):
        assert len(load_examples([DataSource(path=str(path), domain="x")])["x"]) == 1


def test_bad_inputs_are_clear(tmp_path):
    nodom = _jsonl(tmp_path / "n.jsonl", [{"text": "hello"}])
    with pytest.raises(DraftkitError, match="no 'domain' column"):
        load_examples([DataSource(path=str(nodom))])
    odd = _jsonl(tmp_path / "o.jsonl", [{"foo": "bar"}])
    with pytest.raises(DraftkitError, match=r"o.jsonl:1: the row is in none of the shapes "
                                            r"draftkit reads \(its columns: foo\); expected "
                                            r"ShareGPT"):
        load_examples([DataSource(path=str(odd), domain="x")])
    chat = _jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "hi"}]},
                                         {"messages": [{"role": "user", "text": "hi"}]}])
    with pytest.raises(DraftkitError, match=re.escape(
            "c.jsonl:2: message 1 has role (str), text (str); a chat message needs a 'role' "
            "and a 'content' string (text only)")):
        load_examples([DataSource(path=str(chat), domain="x")])
    parts = _jsonl(tmp_path / "m.jsonl", [{"messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}])
    with pytest.raises(DraftkitError, match=re.escape("m.jsonl:1: message 1 has role (str), "
                                                      "content (list)")):
        load_examples([DataSource(path=str(parts), domain="x")])
    by = load_examples([DataSource(path=str(nodom), domain="x")])
    with pytest.raises(DraftkitError, match="domain 'x' has 1 rows that may be held out"):
        split_heldout(by, 1, 0)


def test_hub_dataset_config_name_and_column_mapping(tmp_path, monkeypatch):
    """A gsm8k-like hub dataset (config 'main', question/answer columns), read from a recipe
    without the network: load_dataset gets the config name and the columns are mapped."""
    import datasets

    from draftkit.distill.command import load_config

    calls = []

    def load_dataset(path, name=None, split=None, **kw):
        calls.append((path, name, split))
        return datasets.Dataset.from_dict({"question": ["what is 2 + 2 ?", "and 3 + 3 ?"],
                                           "answer": ["4", "6"]})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data:\n  sources:\n    - path: openai/gsm8k\n      name: main\n"
                      "      domain: math\n      columns: {question: prompt, answer: response}\n")
    (src,) = load_config(recipe).data.sources
    assert src.format == "hub"
    (ex, _) = load_examples([src])["math"]
    assert calls == [("openai/gsm8k", "main", "train")]
    assert ex.messages == [{"role": "user", "content": "what is 2 + 2 ?"}] and ex.response == "4"
    missing = DataSource(path="openai/gsm8k", format="hub", domain="math",
                         columns={"question": "prompt", "solution": "response"})
    with pytest.raises(DraftkitError, match="openai/gsm8k has no column 'solution' .*"
                                            "its columns: question, answer"):
        load_examples([missing])
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_dict(
        {"question": [], "answer": []}))
    with pytest.raises(DraftkitError, match="openai/gsm8k has no rows; check its split 'train' "
                                            "and name"):
        load_examples([src])


def test_column_mapping_on_local_files_and_bad_mappings(tmp_path):
    from draftkit.config import from_dict
    from draftkit.errors import ConfigError

    path = _jsonl(tmp_path / "q.jsonl", [{"q": "hi", "a": "hello", "prompt": "unused"}])
    src = DataSource(path=str(path), domain="chat", columns={"q": "prompt", "a": "response"})
    (ex,) = load_examples([src])["chat"]  # the mapped column wins over one of the same name
    assert ex.messages[0]["content"] == "hi" and ex.response == "hello"
    with pytest.raises(ConfigError, match="r.yaml: .*renames 'q' to 'prompts', "
                                          "which is not one of conversations, messages, prompt"):
        from_dict(DataSource, {"path": "x.jsonl", "columns": {"q": "prompts"}}, "r.yaml")
    with pytest.raises(ConfigError, match="key 'columns' expects mapping of str to str"):
        from_dict(DataSource, {"path": "x.jsonl", "columns": ["q:prompt"]}, "r.yaml")
    with pytest.raises(ConfigError, match="renames two columns to the same one"):
        from_dict(DataSource, {"path": "x.jsonl", "columns": {"q": "prompt", "a": "prompt"}},
                  "r.yaml")
    with pytest.raises(DraftkitError, match="name 'main' .* local file"):
        load_examples([DataSource(path=str(path), domain="chat", name="main")])


def test_train_only_sources_leave_the_heldout_split_alone(tmp_path):
    hand = _jsonl(tmp_path / "hand.jsonl", [{"prompt": f"hand {i}"} for i in range(6)])
    extra = _jsonl(tmp_path / "extra.jsonl", [{"prompt": f"extra {i}"} for i in range(20)])
    alone = load_examples([DataSource(path=str(hand), domain="code")])
    both = load_examples([DataSource(path=str(hand), domain="code"),
                          DataSource(path=str(extra), domain="code", heldout=False)])
    train0, held0 = split_heldout(alone, 2, 0)
    train1, held1 = split_heldout(both, 2, 0)
    prompts = lambda exs: [ex.messages[0]["content"] for ex in exs]  # noqa: E731
    assert prompts(held1) == prompts(held0)  # the same held-out rows, in the same order
    assert prompts(train1) == prompts(train0) + [f"extra {i}" for i in range(20)]
    only_extra = load_examples([DataSource(path=str(extra), domain="code", heldout=False)])
    with pytest.raises(DraftkitError, match="0 rows that may be held out and 20 in all"):
        split_heldout(only_extra, 2, 0)


def test_response_only_mask(tok):
    from draftkit.data.sources import Example

    ex = Example("math", messages=[{"role": "user", "content": "what is 2 + 2 ?"}],
                 response="4 .", origin="t:1")
    t = tokenize_example(tok, ex)
    text = tok.decode([i for i, m in zip(t.ids, t.target) if m])
    assert text.split()[:2] == ["4", "."]  # the answer and the end-of-turn are trained
    assert "what" not in text and "user" not in text
    full = tokenize_example(tok, ex, response_only=False)
    assert all(full.target)


def test_nothing_the_template_writes_after_the_end_of_turn_is_trained(tok):
    """ChatML ends a turn with '<|im_end|>' and a newline; decoding stops at the end token, so
    the newline after it was trained (and scored) where no draft ever drafts."""
    from draftkit.data.sources import Example

    tok.chat_template = tok.chat_template.replace("' <|im_end|> '", "' <|im_end|> .'")
    ex = Example("math", messages=[{"role": "user", "content": "what is 2 + 2 ?"}],
                 response="4 <pad>", origin="t:1")

    def trained(**kw):
        t = tokenize_example(tok, ex, **kw)
        return tok.convert_ids_to_tokens([i for i, m in zip(t.ids, t.target) if m])
    # at the tokenizer's eos, not at any special token the response holds
    assert trained() == ["4", "<pad>", "<|im_end|>"]
    # at the target's own end-of-turn token, where its generation config says decoding stops
    assert trained(stop_ids=[tok.convert_tokens_to_ids("<pad>")]) == ["4", "<pad>"]


def test_truncation_leaves_out_rows_it_would_leave_without_a_response(tmp_path, tok, capfd):
    """A prompt that fills data.seq_len on its own: truncating keeps the prompt and trains
    nothing. Such rows are left out and said; a domain left with no held-out row is an error
    (its alpha would quietly go missing)."""
    long = " ".join(["the"] * 80)
    rows = [{"prompt": f"what is {i} ?", "response": "4 .", "domain": "math"} for i in range(6)]
    src = _jsonl(tmp_path / "r.jsonl", rows + [{"prompt": long, "response": "4 .",
                                               "domain": "math"}])
    data = DataSection(sources=[DataSource(path=str(src), heldout=False)], seq_len=32,
                       truncate=True, heldout_per_domain=1)
    data.sources.append(DataSource(path=str(_jsonl(tmp_path / "h.jsonl", rows[:2]))))
    train, held = build_rows(data, tok, seed=0)
    assert (train.loss_mask.sum(1) > 0).all() and (held.loss_mask.sum(1) > 0).all()
    assert "1 example(s) left out: their prompt fills data.seq_len=32" in capfd.readouterr().err
    only_long = _jsonl(tmp_path / "l.jsonl", [{"prompt": f"{i} {long}", "response": "4 .",
                                               "domain": "code"} for i in range(2)])
    data.sources.append(DataSource(path=str(only_long)))
    with pytest.raises(DraftkitError, match="domain 'code' has no held-out row left"):
        build_rows(data, tok, seed=0)


def test_packing_and_shifted_mask(tok):
    from draftkit.data.pack import Tokenized

    exs = [Tokenized([5, 6, 7], [False, True, True], "a", "x:1"),
           Tokenized([8, 9], [True, True], "b", "x:2"),
           Tokenized([10, 11, 12], [False, False, True], "a", "x:3")]
    rows = pack(exs, seq_len=6, pad_id=3, domains=["a", "b"])
    assert rows.input_ids.tolist() == [[5, 6, 7, 10, 11, 12], [8, 9, 3, 3, 3, 3]]
    assert rows.domain_ids.tolist() == [0, 1]
    # loss_mask[t]: the prediction of token t + 1; an example's first token is never a target
    assert rows.loss_mask.tolist() == [[True, True, False, False, True, False],
                                       [True, False, False, False, False, False]]
    # positions restart at each packed example and at the padding
    assert rows.position_ids.tolist() == [[0, 1, 2, 0, 1, 2], [0, 1, 0, 1, 2, 3]]
    unpacked = pack(exs, seq_len=6, pad_id=3, domains=["a", "b"], pack=False)
    assert len(unpacked) == 3
    with pytest.raises(DraftkitError, match="longer than data.seq_len=2"):
        pack(exs, seq_len=2, pad_id=3, domains=["a", "b"])
    assert pack(exs, 2, 3, ["a", "b"], truncate=True).input_ids.shape[1] == 2
    text = Tokenized(list(range(5, 12)), [True] * 7, "a", "t:1", splittable=True)
    pieces = pack([text], seq_len=3, pad_id=3, domains=["a"], pack=False)
    assert pieces.input_ids.tolist() == [[5, 6, 7], [8, 9, 10], [11, 3, 3]]


def test_packed_examples_do_not_attend_to_each_other():
    """The second example of a packed row gets the logits it gets alone, through the same
    calls training and the teacher cache make (MaskedLM with the rows' position_ids)."""
    from draftkit.data.pack import Tokenized, positions
    from draftkit.distill.teacher import MaskedLM

    model = make_llama(64, seed=3)
    first, second = [5, 6, 7, 8, 9], [10, 11, 12, 13]
    rows = pack([Tokenized(first, [True] * 5, "a", "x:1"),
                 Tokenized(second, [True] * 4, "a", "x:2")], seq_len=12, pad_id=3, domains=["a"])
    mask = torch.zeros_like(rows.loss_mask)
    mask[0, 5:9] = True  # the second example's positions
    lm = MaskedLM(model)
    with torch.no_grad():
        packed, _ = lm(rows.input_ids, mask, positions(rows, slice(None)))
        alone = model(torch.tensor([second]), use_cache=False).logits[0]
        leaky, _ = lm(rows.input_ids, mask)  # no positions: the old, leaking behaviour
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(leaky, alone, atol=1e-3)


def test_target_generated_cache_resumes(tmp_path, tok):
    model = make_llama(len(tok), num_layers=1)
    prompts = [tok("<|im_start|>user hello <|im_end|> <|im_start|>assistant ")["input_ids"],
               tok("<|im_start|>user what is 2 <|im_end|> <|im_start|>assistant ")["input_ids"],
               tok("<|im_start|>user sum <|im_end|> <|im_start|>assistant ")["input_ids"]]
    path = tmp_path / "gen" / "r.jsonl"
    first = generate_responses(model, tok, prompts[:2], path, 5, 2, progress=False)
    assert len(read_cache(path)) == 2
    with open(path, "a") as f:
        f.write('{"key": "torn')  # a run killed mid-write
    from draftkit.data import generate as gen

    calls = []
    orig = gen.engine_answers

    def counted(model, prompts, *args):
        calls.append(len(prompts))
        return orig(model, prompts, *args)

    with mock.patch.object(gen, "engine_answers", counted):
        again = generate_responses(model, tok, prompts, path, 5, 2, progress=False)
    assert calls == [1]  # only the new prompt was generated
    assert again[:2] == first and all(1 <= len(r) <= 5 for r in again)
    # greedy answers equal a plain per-prompt generate
    solo = model.generate(input_ids=torch.tensor([prompts[2]]), max_new_tokens=5,
                          do_sample=False, pad_token_id=3,
                          eos_token_id=2)[0, len(prompts[2]):].tolist()
    assert again[2] == solo[:len(again[2])]


def test_sampled_answers_depend_on_their_seed_and_leave_the_callers_rng_alone(tmp_path, tok):
    model = make_llama(len(tok), num_layers=1)
    prompts = [tok(f"<|im_start|>user {w} <|im_end|> <|im_start|>assistant ")["input_ids"]
               for w in ("hello", "sum", "what is 2")]
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = generate_responses(model, tok, prompts, tmp_path / "a.jsonl", 6, 2, 1.0, seed=5,
                               progress=False)
    # a run that generates its answers goes on from the same RNG state as one that reads them
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(999)
    again = generate_responses(model, tok, prompts, tmp_path / "b.jsonl", 6, 2, 1.0, seed=5,
                               progress=False)
    assert again == first


def test_build_rows_target_regime(tmp_path, tok):
    src = _jsonl(tmp_path / "p.jsonl", [{"prompt": f"what is {i} + {i} ?", "domain": "math"}
                                        for i in range(5)] +
                 [{"prompt": f"print {i}", "domain": "code"} for i in range(4)])
    data = DataSection(sources=[DataSource(path=str(src))], regime="target", seq_len=64,
                       heldout_per_domain=2)
    answers = lambda prompts, temperature, seed: [[7, 8, 2] for _ in prompts]  # noqa: E731
    train, held = build_rows(data, tok, seed=0, generate=answers)
    assert held.domains == ["math", "code"] and len(held) == 4
    assert sorted(held.domain_ids.tolist()) == [0, 0, 1, 1]
    assert train.loss_mask.sum() == 3 * (3 + 2)  # 3 answer tokens per training example
    assert (held.loss_mask.sum(1) == 3).all()
    data.response_only = False  # the prompts join the loss; held-out alpha stays on answers
    train_all, held_all = build_rows(data, tok, seed=0, generate=answers)
    assert train_all.loss_mask.sum() > train.loss_mask.sum() + 5 * 3
    assert torch.equal(held_all.loss_mask, held.loss_mask)


def test_one_text_file_gives_training_and_heldout_passages(tmp_path, tok):
    from draftkit.data import passages

    lines = [f"the {w} is long and the water is {w}\n" for w in "a of to in it on as".split()]
    text = "".join(lines * 6)
    (tmp_path / "one.txt").write_text(text)
    data = DataSection(sources=[DataSource(path=str(tmp_path / "one.txt"), domain="prose")],
                       regime="fixed", seq_len=48, heldout_per_domain=2)
    train, held = build_rows(data, tok, seed=0)
    assert len(held) == 2 and len(train) >= 1  # one file, yet passages to hold out
    (doc,) = load_examples(data.sources)["prose"]
    cut = passages(doc, tok, 48)
    assert "".join(ex.text for ex in cut) == text  # whole lines, nothing lost or repeated
    assert all(len(tok(ex.text)["input_ids"]) <= 48 for ex in cut) and len(cut) > 3
    chat = load_examples([DataSource(path=str(_jsonl(tmp_path / "c.jsonl", [{"text": text}])),
                                     domain="prose")])["prose"][0]
    assert passages(chat, tok, 48) == [chat]  # a JSONL text row stays one example


def test_extra_sampled_answers_add_training_examples_only(tmp_path, tok):
    src = _jsonl(tmp_path / "p.jsonl", [{"prompt": f"what is {i} + {i} ?", "domain": "math"}
                                        for i in range(5)])
    data = DataSection(sources=[DataSource(path=str(src))], regime="target", seq_len=64,
                       heldout_per_domain=2, pack=False)
    data.generate.extra_samples = 2
    calls = []

    def answers(prompts, temperature, seed):
        calls.append((len(prompts), temperature, seed))
        return [[7] * (1 + len(calls)) + [2] for _ in prompts]  # each draw its own length

    train, held = build_rows(data, tok, seed=5, generate=answers)
    # greedy answers for all 5 prompts, then two sampled draws for the 3 training prompts,
    # each with a seed of its own
    assert calls == [(5, 0.0, 5), (3, 1.0, 5), (3, 1.0, 6)]
    assert len(train) == 9 and sorted(train.loss_mask.sum(1).tolist()) == [3] * 3 + [4] * 3 + \
        [5] * 3
    assert len(held) == 2 and (held.loss_mask.sum(1) == 3).all()
    # sampling the first answers too: the extra draws never reuse the first draw's seed
    data.generate.temperature, calls[:] = 1.0, []
    build_rows(data, tok, seed=5, generate=answers)
    assert [c[2] for c in calls] == [5, 6, 7]


def test_rows_name_their_own_file_and_bad_values_are_one_line(tmp_path):
    from draftkit.data.sources import source_format

    _jsonl(tmp_path / "a.jsonl", [{"prompt": "what is 2 + 2 ?", "response": 4}])
    _jsonl(tmp_path / "b.jsonl", [{"text": "x = 1"}, {"text": ["x", "=", "1"]}])
    glob_src = DataSource(path=str(tmp_path / "*.jsonl"), domain="d")
    with pytest.raises(DraftkitError, match=r"^b.jsonl:2: 'text' is a list .* must be a string"):
        load_examples([glob_src])  # the file and row it is in, not the glob's running count
    _jsonl(tmp_path / "b.jsonl", [{"text": "x = 1"}])
    first, second = load_examples([glob_src])["d"]  # files of different schemas
    assert first.response == "4" and second.text == "x = 1"  # a numeric answer is its digits
    (tmp_path / "latin.jsonl").write_bytes(b'{"text": "caf\xe9"}\n')
    (tmp_path / "broken.jsonl").write_text('{"text": "a" "b"}\n')
    (tmp_path / "rows[v2].jsonl").write_text('{"text": "kept"}\n')
    (tmp_path / "folder").mkdir()
    cases = {"latin.jsonl": "latin.jsonl is not UTF-8 text .*; save it as UTF-8",
             "broken.jsonl": "cannot read .*broken.jsonl as json \\(JSON parse error",
             "folder": "folder is a folder; give its files, such as .*folder/\\*.jsonl"}
    for name, message in cases.items():
        with pytest.raises(DraftkitError, match=message):
            load_examples([DataSource(path=str(tmp_path / name), domain="d", format="json")])
    with pytest.raises(DraftkitError, match="split 'test' picks a hub dataset's split"):
        source_format(DataSource(path=str(tmp_path / "b.jsonl"), split="test"))
    (kept,) = load_examples([DataSource(path=str(tmp_path / "rows[v2].jsonl"), domain="d")])["d"]
    assert kept.text == "kept"


def test_rows_the_chat_template_cannot_render_are_named(tmp_path, tok):
    from draftkit.data.sources import Example

    system = Example("chat", messages=[{"role": "system", "content": "be brief"},
                                       {"role": "user", "content": "hi"}], response="hello",
                     origin="c.jsonl:3")
    strict = copy.deepcopy(tok)
    strict.chat_template = ("{% if messages[0]['role'] == 'system' %}"
                            "{{ raise_exception('System role not supported') }}{% endif %}"
                            + tok.chat_template)
    with pytest.raises(DraftkitError, match=r"^c.jsonl:3: the chat template cannot render these "
                                            r"messages \(TemplateError: System role not"):
        tokenize_example(strict, system)
    bare = copy.deepcopy(tok)
    bare.chat_template = None
    with pytest.raises(DraftkitError, match="c.jsonl:3: the target's tokenizer has no chat "
                                            "template, .* give 'text' rows"):
        tokenize_example(bare, system)


def test_a_templateless_targets_prompts_keep_its_bos_as_its_text_rows_do():
    """A base model without a chat template is trained on text rows that start with its BOS;
    its prompts for eval, generate and bench lost it (only --raw kept it)."""
    from tokenizers import processors

    from draftkit.chat import encode_prompt
    from draftkit.data.sources import Example

    tok = make_tokenizer()
    tok.chat_template = None
    bos = tok.bos_token_id
    tok._tokenizer.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", bos)])
    assert tokenize_example(tok, Example("t", text="def x", origin="t")).ids[0] == bos
    assert encode_prompt(tok, "def x", raw=True)[0] == bos
    assert encode_prompt(tok, "def x") == encode_prompt(tok, "def x", raw=True)


def test_token_id_rows_train_their_answer_as_served_and_bad_ids_are_named(tmp_path, tok):
    """Rows of served traffic: the prompt's and the answer's ids as they are; only the answer
    is trained, with no template rendered again; ids another tokenizer made are refused."""
    rows = [{"prompt_ids": [5, 6, 7 + i], "response_ids": [9, 10, 11, 12], "domain": "chat"}
            for i in range(6)]
    src = _jsonl(tmp_path / "ids.jsonl", rows)
    data = DataSection(sources=[DataSource(path=str(src))], regime="fixed", seq_len=32,
                       heldout_per_domain=2)
    train, held = build_rows(data, tok, seed=0)
    assert train.loss_mask.sum() == 4 * 4 and (held.loss_mask.sum(1) == 4).all()
    first = held.input_ids[0][:7].tolist()
    assert first[:2] == [5, 6] and first[3:] == [9, 10, 11, 12]
    # the mask is shifted: the prediction made at the prompt's last token (of the answer's first)
    assert held.loss_mask[0][:7].tolist() == [False, False, True, True, True, True, False]
    for bad, said in (({"prompt_ids": [5, "x"], "response_ids": [9]}, "'prompt_ids' must be"),
                      ({"prompt_ids": [5], "response_ids": []}, "'response_ids' must be"),
                      ({"prompt_ids": [5], "response_ids": [len(tok) + 3]},
                       f"token id {len(tok) + 3} is outside the target's vocabulary")):
        _jsonl(src, [dict(bad, domain="chat")] + rows)
        with pytest.raises(DraftkitError, match=f"ids.jsonl:1: {said}"):
            build_rows(data, tok, seed=0)


def test_a_sources_repeat_weighs_its_training_rows_and_never_its_heldout_ones(tmp_path, tok):
    """``repeat: 3`` trains each of a source's rows three times an epoch, the copies packed
    apart (one pass each), beside another source's single rows; its held-out rows are drawn
    once, and no copy of a held-out prompt is trained. A repeat below 1 is refused."""
    traffic = _jsonl(tmp_path / "traffic.jsonl", [
        {"prompt_ids": [5, 6, 7 + i], "response_ids": [9, 10, 11], "domain": "chat"}
        for i in range(6)])
    replay = _jsonl(tmp_path / "replay.jsonl", [
        {"prompt_ids": [5, 6, 20 + i], "response_ids": [9, 10], "domain": "chat"}
        for i in range(4)])
    data = DataSection(sources=[DataSource(path=str(traffic), repeat=3),
                                DataSource(path=str(replay), heldout=False)],
                       regime="fixed", seq_len=32, heldout_per_domain=2, pack=False)
    train, held = build_rows(data, tok, seed=0)
    third = train.input_ids[:, 2].tolist()  # the token that tells the rows apart
    traffic_ids = [t for t in third if t < 20]
    assert len(held) == 2 and len(set(traffic_ids)) == 4 and len(traffic_ids) == 12
    assert sorted(t for t in third if t >= 20) == [20, 21, 22, 23]
    assert not set(held.input_ids[:, 2].tolist()) & set(traffic_ids)
    # a pass each: the four traffic rows, the replay, then the traffic's copies twice over
    assert len(set(third[:4])) == 4 and third[8:12] == third[:4] == third[12:16]
    with pytest.raises(Exception, match="^recipe: key 'repeat' must be >= 1, got 0$"):
        from_dict(DataSource, {"path": str(traffic), "repeat": 0}, "recipe")
