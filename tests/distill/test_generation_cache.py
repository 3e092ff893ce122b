"""The generation cache across killed runs, sampled answers' seeds, held-out prompts that never
reach training, and training prompts that do not change with the date."""

import datetime
import functools
import json
from unittest import mock

import pytest

from draftkit.data import build_rows, load_examples, split_heldout
from draftkit.data.generate import generate_responses, prompt_key, read_cache
from draftkit.distill.config import DataSection, DataSource
from draftkit.errors import DraftkitError
from tests.helpers import CHAT_TEMPLATE, make_llama, make_tokenizer

WORDS = ("hello", "sum of x", "what is 2 + 2", "the water is long", "print 1", "how do you do")


@pytest.fixture
def tok():
    return make_tokenizer()


def _prompts(tok):
    return [tok(f"<|im_start|>user {w} <|im_end|> <|im_start|>assistant ")["input_ids"]
            for w in WORDS]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_run_answering_into_the_same_cache_waits_then_reads(tmp_path, tok, capsys):
    """While another run holds the cache's lock nothing is generated; after it, the answers
    it wrote are read, not generated again."""
    import threading
    import time

    from filelock import FileLock

    model = make_llama(len(tok), num_layers=1)
    prompts = _prompts(tok)
    path = tmp_path / "gen" / "r.jsonl"
    other = FileLock(tmp_path / "gen" / "r.jsonl.lock")
    (tmp_path / "gen").mkdir()
    other.acquire()  # the other run, mid-generation
    got = []
    waiter = threading.Thread(target=lambda: got.append(
        generate_responses(model, tok, prompts, path, 5, 2, progress=False)))
    waiter.start()
    time.sleep(0.5)
    assert waiter.is_alive() and not path.exists()
    theirs = {prompt_key(p): [7, 8] for p in prompts}  # what the other run wrote
    _jsonl(path, [{"key": k, "response_ids": v} for k, v in theirs.items()])
    other.release()
    waiter.join(30)
    assert got == [[[7, 8]] * len(prompts)]
    assert "another run is building it; waiting" in capsys.readouterr().out


def test_a_torn_last_line_is_cut_before_the_next_answer_is_appended(tmp_path, tok):
    model = make_llama(len(tok), num_layers=1)
    prompts = _prompts(tok)
    path = tmp_path / "r.jsonl"
    generate_responses(model, tok, prompts[:2], path, 5, 2, progress=False)
    with open(path, "a") as f:
        f.write('{"key": "torn')  # a run killed mid-write
    generate_responses(model, tok, prompts, path, 5, 2, progress=False)
    # every answer is on a line of its own, none glued onto the torn one
    assert set(read_cache(path)) == {prompt_key(p) for p in prompts}
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_sampled_answers_are_the_same_after_a_resume(tmp_path, tok):
    model = make_llama(len(tok), num_layers=1)
    prompts = _prompts(tok)
    whole = generate_responses(model, tok, prompts, tmp_path / "whole.jsonl", 6, 2, 1.0,
                               seed=5, progress=False)

    # killed after its first two answers
    from draftkit.data import generate as gen

    killed = tmp_path / "killed.jsonl"
    orig, calls = gen.append_jsonl, []

    def dies_after_two(path, row):
        calls.append(1)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return orig(path, row)

    with mock.patch.object(gen, "append_jsonl", dies_after_two):
        with pytest.raises(KeyboardInterrupt):
            generate_responses(model, tok, prompts, killed, 6, 2, 1.0, seed=5, progress=False)
    assert len(read_cache(killed)) == 2
    assert generate_responses(model, tok, prompts, killed, 6, 2, 1.0, seed=5,
                              progress=False) == whole

    # a cache that an earlier run over some of the prompts began: other batches, same answers
    partial = tmp_path / "partial.jsonl"
    generate_responses(model, tok, prompts[1:4], partial, 6, 2, 1.0, seed=5, progress=False)
    assert generate_responses(model, tok, prompts, partial, 6, 3, 1.0, seed=5,
                              progress=False) == whole

    greedy = generate_responses(model, tok, prompts, tmp_path / "greedy.jsonl", 6, 2,
                                progress=False)
    assert whole != greedy  # they were sampled
    other = generate_responses(model, tok, prompts, tmp_path / "other.jsonl", 6, 2, 1.0,
                               seed=6, progress=False)
    assert other != whole  # and depend on the seed


def test_the_engine_answers_as_hf_generate_does_greedily(tmp_path, tok):
    """draftkit's engine (continuous batching: rows of unequal length leave and others enter)
    gives HF generate's greedy answers, each cut after its first stop token."""
    from draftkit.data.generate import answer_stop_ids, cut_at_stop
    from tests.helpers import hf_greedy

    model = make_llama(len(tok), num_layers=2, seed=4)
    prompts = _prompts(tok)
    stop_ids = answer_stop_ids(model, tok)
    hf = [cut_at_stop(hf_greedy(model, p, 9, eos_token_id=stop_ids), set(stop_ids))
          for p in prompts]
    ours = generate_responses(model, tok, prompts, tmp_path / "r.jsonl", 9, 4, progress=False)
    assert ours == hf
    assert len({len(a) for a in hf}) > 1  # one row stops early: its slot is refilled
    from draftkit.decode import engine, runners

    general = functools.partial(runners.make_runner, fast=False)  # cohorts, not slots
    with mock.patch.object(engine, "make_runner", lambda m, fast=None: general(m)):
        assert generate_responses(model, tok, prompts, tmp_path / "g.jsonl", 9, 4,
                                  progress=False) == hf


def test_answers_in_memory_depend_on_their_seed_alone(tok):
    """An on-policy answer is sampled from its own seed (the engine's per-row generator): the
    same alone as beside other prompts, and another seed draws another answer."""
    from draftkit.data.generate import answers_in_memory

    model = make_llama(len(tok), num_layers=1, seed=3)
    prompts = _prompts(tok)
    together = answers_in_memory(model, prompts, 8, 1.0, [tok.eos_token_id],
                                 list(range(len(prompts))))
    alone = answers_in_memory(model, prompts[2:3], 8, 1.0, [tok.eos_token_id], [2])
    assert alone == together[2:3]
    reseeded = answers_in_memory(model, prompts, 8, 1.0, [tok.eos_token_id],
                                 [s + 100 for s in range(len(prompts))])
    assert reseeded != together
    with pytest.raises(ValueError, match="one seed a prompt"):
        answers_in_memory(model, prompts, 8, 1.0, [tok.eos_token_id], None)


def test_extra_answers_never_reuse_the_first_answers_seed(tmp_path, tok):
    src = _jsonl(tmp_path / "p.jsonl", [{"prompt": f"what is {i} + {i} ?", "domain": "math"}
                                        for i in range(5)])
    data = DataSection(sources=[DataSource(path=str(src))], regime="target", seq_len=64,
                       heldout_per_domain=2)
    data.generate.temperature, data.generate.extra_temperature = 0.7, 1.0
    data.generate.extra_samples = 2
    calls = []

    def answers(prompts, temperature, seed):
        calls.append((temperature, seed))
        return [[7, 2] for _ in prompts]

    build_rows(data, tok, 5, answers)
    assert calls == [(0.7, 5), (1.0, 6), (1.0, 7)]


def test_heldout_prompts_never_reach_training(tmp_path):
    # several answers per prompt, duplicate rows, and a train-only source repeating prompts
    multi = _jsonl(tmp_path / "multi.jsonl",
                   [{"prompt": f"what is {i} + {i} ?", "response": r, "domain": "math"}
                    for i in range(6) for r in ("the answer", "it is")] +
                   [{"text": f"def f{i} ( ) : return 1", "domain": "code"}
                    for i in range(4) for _ in range(2)])
    extra = _jsonl(tmp_path / "extra.jsonl", [{"prompt": f"what is {i} + {i} ?",
                                               "domain": "math"} for i in range(6)])
    by = load_examples([DataSource(path=str(multi)),
                        DataSource(path=str(extra), heldout=False)])
    train, held = split_heldout(by, 2, 0)
    prompt = lambda ex: ex.text or ex.messages[0]["content"]  # noqa: E731
    held_prompts = [prompt(ex) for ex in held]
    assert len(held) == 4 and len(set(held_prompts)) == 4  # two distinct prompts a domain
    assert not set(held_prompts) & {prompt(ex) for ex in train}
    # every other row still trains: 4 math prompts x (2 answers + 1 train-only), 2 code x 2
    assert len(train) == 4 * 3 + 2 * 2
    again_train, again_held = split_heldout(by, 2, 0)
    assert again_held == held and again_train == train  # deterministic by seed
    with pytest.raises(DraftkitError, match="has 2 rows that may be held out and 2 in all "
                                        r"\(rows with the same prompt count once\)"):
        split_heldout({"code": by["code"][:4]}, 2, 0)


@pytest.mark.parametrize("dating", [
    # Llama 3.x's way: the system header carries date_string, or today's date without one
    "{%- if not date_string is defined %}{%- set date_string = strftime_now('%d %b %Y') %}"
    "{%- endif %}{{ '<|im_start|>system ' + date_string + ' <|im_end|> ' }}",
    # Mistral's way: today's date, whatever the caller passes
    "{%- set today = strftime_now(\"%d %b %Y\") %}"
    "{{ '<|im_start|>system ' + today + ' <|im_end|> ' }}",
], ids=["date_string", "strftime_now"])
def test_training_prompts_do_not_change_with_the_date(tmp_path, dating):
    import transformers.utils.chat_template_utils as ctu

    from draftkit.chat import encode_prompt

    tok = make_tokenizer(("26", "Jul", "2024", "30", "Nov", "01", "Dec", "2026"))
    tok.chat_template = dating + CHAT_TEMPLATE
    src = _jsonl(tmp_path / "p.jsonl", [{"prompt": f"what is {i} + {i} ?", "response": "4",
                                         "domain": "math"} for i in range(5)])
    built, served = [], []
    for day in (datetime.datetime(2026, 11, 30), datetime.datetime(2026, 12, 1)):
        class Day(datetime.datetime):
            @classmethod
            def now(cls, tz=None):
                return day

        sent = []

        def answers(prompts, temperature, seed):
            sent.extend(prompts)
            return [[7, 2] for _ in prompts]

        with mock.patch.object(ctu, "datetime", Day):
            for regime in ("fixed", "target"):
                data = DataSection(sources=[DataSource(path=str(src))], regime=regime,
                                   seq_len=64, heldout_per_domain=2)
                train, held = build_rows(data, tok, 0, answers)
                built.append((train.input_ids.tolist(), held.input_ids.tolist()))
            built.append(sent)
            served.append(tok.decode(encode_prompt(tok, "hello")))
    assert built[:3] == built[3:]
    assert "26 Jul 2024" in tok.decode(built[0][0][0])
    # serving still sends today's date
    assert "30 Nov 2026" in served[0] and "01 Dec 2026" in served[1]


def test_answers_stop_where_decoding_stops_and_greedy_ones_are_shared_across_seeds(tmp_path):
    """Gemma and Llama 3 end a turn with a token their generation config lists beside the
    tokenizer's eos: answers ran past it to max_new_tokens, text serving never reaches. Greedy
    answers do not depend on the seed, so a seed sweep reuses them."""
    from draftkit.data.generate import cache_file, generate_responses
    from draftkit.decode.engine import SpeculativeEngine

    tok = make_tokenizer()
    model = make_llama(len(tok), num_layers=1, seed=1)
    prompt = tok("<|im_start|>user hello <|im_end|> <|im_start|>assistant ")["input_ids"]
    free = generate_responses(model, tok, [prompt], tmp_path / "a.jsonl", 8, 1,
                              progress=False)[0]
    turn_end = free[1]
    cut = free[:free.index(turn_end) + 1]
    assert turn_end != tok.eos_token_id and len(cut) < len(free)
    model.generation_config.eos_token_id = [tok.eos_token_id, turn_end]
    assert turn_end in SpeculativeEngine(model, None).eos
    assert generate_responses(model, tok, [prompt], tmp_path / "b.jsonl", 8, 1,
                              progress=False)[0] == cut
    stops = [tok.eos_token_id, turn_end]
    assert cache_file(tmp_path, "t", 8, 0.0, 0, stops) == cache_file(tmp_path, "t", 8, 0.0, 1,
                                                                      stops)
    assert cache_file(tmp_path, "t", 8, 1.0, 0, stops) != cache_file(tmp_path, "t", 8, 1.0, 1,
                                                                      stops)
    assert cache_file(tmp_path, "t", 8, 0.0, 0, stops) != cache_file(tmp_path, "t", 8, 0.0, 0,
                                                                      stops[:1])


def test_a_template_passing_strftime_now_a_variable_still_gets_a_date():
    """Only literal formats can be fixed to the training day; another still renders today's
    date, as without draftkit (it rendered nothing)."""
    from draftkit.data import _TrainingRender

    tok = make_tokenizer()
    tok.chat_template = ("{%- set fmt = '%Y' %}{{ '<|im_start|>system ' + strftime_now(fmt) + "
                         "' <|im_end|> ' }}" + CHAT_TEMPLATE)
    text = _TrainingRender(tok).apply_chat_template([{"role": "user", "content": "hi"}],
                                               tokenize=False)
    assert f"system {datetime.date.today().year} <|im_end|>" in text
