"""Chat data as it comes: the published row shapes, the assistant turns of multi-turn chats
under Llama-3-style, Qwen3-style and marking templates, the target answering every turn, and
a ShareGPT file through ``--dry-run`` and two training steps."""

import json
import re

import pytest
import yaml

from draftkit.data import build_rows, load_examples, tokenize_example
from draftkit.data.shapes import Example
from draftkit.data.turns import answer_every_turn, render_chat
from draftkit.distill.config import DataSection, DataSource
from draftkit.errors import DraftkitError
from tests.helpers import make_tokenizer


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


USER_WORDS = ("water", "oil", "people", "time", "day", "number", "way", "part")


def _sharegpt(i: int) -> dict:
    """A two-turn ShareGPT conversation; the user and gpt speak words of sets of their own."""
    return {"id": f"c{i}", "conversations": [
        {"from": "system", "value": "you are here"},
        {"from": "human", "value": f"what is {USER_WORDS[i]} ?"},
        {"from": "gpt", "value": f"answer {i} ."},
        {"from": "human", "value": "why"},
        {"from": "gpt", "value": "it was so ."}]}


# --- the row shapes -----------------------------------------------------------------------------

def test_each_published_shape_is_read_by_its_columns(tmp_path):
    turns = [("user", "hi"), ("assistant", "hello"), ("user", "why"), ("assistant", "so")]
    files = {
        "sharegpt": [{"id": "1", "system": "be brief", "conversations": [
            {"from": {"user": "human", "assistant": "gpt"}[r], "value": c} for r, c in turns]}],
        "specforge": [{"id": "1", "conversations": [
            {"role": "system", "content": "be brief"}] + [
            {"role": r, "content": c} for r, c in turns]}],
        "messages": [{"messages": [{"role": "system", "content": "be brief"}] + [
            {"role": r, "content": c} for r, c in turns]}],
    }
    for shape, rows in files.items():
        path = _jsonl(tmp_path / f"{shape}.jsonl", rows)
        for named in ("auto", shape):
            (ex,) = load_examples([DataSource(path=str(path), domain="chat",
                                              shape=named)])["chat"]
            assert ex.messages == [{"role": "system", "content": "be brief"},
                                   {"role": "user", "content": "hi"},
                                   {"role": "assistant", "content": "hello"},
                                   {"role": "user", "content": "why"}], shape
            assert ex.response == "so"
    # SpecForge's regenerated answers keep their reasoning for the template
    path = _jsonl(tmp_path / "reasoning.jsonl", [{"conversations": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "reasoning_content": "greet"}]}])
    (ex,) = load_examples([DataSource(path=str(path), domain="chat")])["chat"]
    assert (ex.response, ex.reasoning) == ("hello", "greet")
    others = _jsonl(tmp_path / "others.jsonl", [
        {"prompt": "what is 2 ?", "response": 2}, {"prompt_ids": [5, 6], "response_ids": [7]},
        {"text": "def f ( ) : return 1"}])
    a, b, c = load_examples([DataSource(path=str(others), domain="x")])["x"]
    assert a.messages == [{"role": "user", "content": "what is 2 ?"}] and a.response == "2"
    assert (b.prompt_ids, b.response_ids, c.text) == ([5, 6], [7], "def f ( ) : return 1")


def test_a_row_of_no_shape_or_not_the_named_one_stops_the_run_naming_it(tmp_path):
    good = _sharegpt(1)
    path = _jsonl(tmp_path / "chats.jsonl", [good, {"question": "2 + 2 ?", "answer": "4"}])
    with pytest.raises(DraftkitError, match=re.escape(
            "chats.jsonl:2: the row is in none of the shapes draftkit reads (its columns: "
            "question, answer); expected ShareGPT (conversations of from/value "
            "turns), SpecForge (conversations of role/content turns), OpenAI messages")):
        load_examples([DataSource(path=str(path), domain="chat")])
    _jsonl(path, [good, {"messages": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(DraftkitError, match=re.escape(
            "chats.jsonl:2: the source's shape is sharegpt and this row is messages")):
        load_examples([DataSource(path=str(path), domain="chat", shape="sharegpt")])
    for turns, said in (
            ([{"from": "human", "value": "hi"}, {"from": "tool", "value": "x"}],
             "turn 2 is from 'tool'; a ShareGPT turn needs 'from' (one of human, user, gpt"),
            ([{"from": "gpt", "value": "hello"}, {"from": "human", "value": "hi"}],
             "the chat opens with an assistant turn"),
            ([{"from": "gpt", "value": "hello"}], "the chat has no user turn")):
        _jsonl(path, [{"conversations": turns}])
        with pytest.raises(DraftkitError, match=re.escape(f"chats.jsonl:1: {said}")):
            load_examples([DataSource(path=str(path), domain="chat")])


# --- where a template puts the assistant turns --------------------------------------------------

LLAMA3 = (  # Llama 3.1's template without tools: a dated system header, turns ended by eot
    "{{- bos_token }}{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}"
    "{%- endif %}{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] | trim %}{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: ' + date_string + '\\n\\n' }}"
    "{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")

QWEN3 = (  # Qwen3's without tools: reasoning kept only after the last user turn
    "{%- if messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- set ns = namespace(last_query_index=messages|length - 1, found=false) %}"
    "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if not ns.found and message.role == 'user' %}{%- set ns.found = true %}"
    "{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}{%- set content = message.content %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{%- set reasoning_content = '' %}"
    "{%- if message.reasoning_content is string %}"
    "{%- set reasoning_content = message.reasoning_content %}"
    "{%- elif '</think>' in content %}"
    "{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n')"
    ".split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n') + "
    "'\\n</think>\\n\\n' + content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")

MARKED = (  # ChatML with {% generation %} blocks: the template marks its answers itself
    "{%- for m in messages %}{%- if m.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}{% generation %}{{- m.content }}{% endgeneration %}"
    "{{- '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + "
    "'<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def _bpe(template: str, special: list[str], eos: str):
    """A small byte-level BPE tokenizer (merges learnt here, as real ones have them) with
    ``template``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(
        ["what is two plus two?\n\nfour, as you know.\nwhy is it so? because it is.\n"] * 4,
        trainers.BpeTrainer(vocab_size=400, special_tokens=special, show_progress=False,
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=eos, bos_token=special[0])
    tok.chat_template = template
    return tok


CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is two?"},
        {"role": "assistant", "content": "two, as you know."},
        {"role": "user", "content": "why is it so?"},
        {"role": "assistant", "content": "because it is."}]


def _spans(tok, ids, mask) -> list[str]:
    """The masked runs of ``ids``, decoded."""
    runs, run = [], []
    for i, m in zip(ids, mask):
        if m:
            run.append(i)
        elif run:
            runs.append(run)
            run = []
    return [tok.decode(r) for r in runs + ([run] if run else [])]


def _render(tok, messages, generation_prompt, **template_kwargs):
    from draftkit.data import _TrainingRender

    rendered = _TrainingRender(tok, **template_kwargs)
    eos = [tok.eos_token_id]
    ids, mask = render_chat(rendered, messages, generation_prompt, eos)
    # the ids are the template's text, tokenized as a prompt is
    text = rendered.apply_chat_template(messages, tokenize=False,
                                        add_generation_prompt=generation_prompt)
    assert ids == tok(text, add_special_tokens=False)["input_ids"]
    return _spans(tok, ids, mask)


def test_a_llama3_template_trains_each_answer_through_its_end_of_turn():
    tok = _bpe(LLAMA3, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                        "<|eot_id|>"], "<|eot_id|>")
    assert _render(tok, CHAT, False) == ["two, as you know.<|eot_id|>",
                                         "because it is.<|eot_id|>"]
    # a prompt's history: its answers are trained, the header it ends with is not
    assert _render(tok, CHAT[:4], True) == ["two, as you know.<|eot_id|>"]
    with pytest.raises(DraftkitError, match="data.enable_thinking is set, and the target's "
                                            "chat template has no reasoning mode"):
        _render(tok, CHAT, False, enable_thinking=False)


@pytest.mark.parametrize("thinking, last", [
    (None, "<think>\n\n</think>\n\nbecause it is.<|im_end|>"),  # a think block it writes itself
    (False, "because it is.<|im_end|>")])  # the template's prompt holds the empty block
def test_a_qwen3_template_trains_each_answer_as_it_renders_it(thinking, last):
    tok = _bpe(QWEN3, ["<|im_start|>", "<|im_end|>", "<think>", "</think>"], "<|im_end|>")
    kw = {} if thinking is None else {"enable_thinking": thinking}
    assert _render(tok, CHAT, False, **kw) == ["two, as you know.<|im_end|>", last]
    # an earlier answer's reasoning is dropped from the history, the last one's kept
    reasoned = [dict(m) for m in CHAT]
    reasoned[2]["content"] = "<think>\nit is two\n</think>\n\ntwo, as you know."
    if thinking is None:
        reasoned[4]["reasoning_content"] = "so it is"
        last = "<think>\nso it is\n</think>\n\nbecause it is.<|im_end|>"
    assert _render(tok, reasoned, False, **kw) == ["two, as you know.<|im_end|>", last]


def test_a_template_that_marks_its_answers_is_taken_at_its_word():
    tok = _bpe(MARKED, ["<|im_start|>", "<|im_end|>"], "<|im_end|>")
    assert _render(tok, CHAT[1:], False) == ["two, as you know.<|im_end|>",
                                             "because it is.<|im_end|>"]


def test_a_template_that_rewrites_earlier_turns_is_refused_naming_the_row():
    tok = make_tokenizer()
    # the first turn is written otherwise once an answer follows it
    tok.chat_template = ("{% if messages | length > 2 %}{{ 'hello ' }}{% endif %}"
                         + tok.chat_template)
    chat = Example("chat", messages=CHAT[1:4], response="so", origin="c.jsonl:4")
    with pytest.raises(DraftkitError, match=r"^c.jsonl:4: the chat template writes the turns "
                                            r"before assistant turn 1 otherwise"):
        tokenize_example(tok, chat)


# --- the target answers every turn --------------------------------------------------------------

def test_the_target_answers_every_user_turn_with_its_own_history():
    tok = make_tokenizer()
    chats = [Example("chat", messages=[{"role": "system", "content": "be brief"},
                                       {"role": "user", "content": "hello"},
                                       {"role": "assistant", "content": "long day"},
                                       {"role": "user", "content": "when"},
                                       {"role": "assistant", "content": "long day"},
                                       {"role": "user", "content": "how"}], origin="a:1"),
             Example("chat", messages=[{"role": "user", "content": "hi"}], response="x",
                     origin="a:2")]
    asked = []

    def generate(prompts, temperature, seed):  # answers "water", then "oil", and its end token
        asked.append([tok.decode(p).split() for p in prompts])
        return [tok.convert_tokens_to_ids([("water", "oil")[len(asked) - 1], "<|im_end|>"])]

    eos = [tok.eos_token_id]
    first, second = answer_every_turn(chats, tok, generate, 0.0, 0, eos)
    assert [len(a) for a in asked] == [1, 1]  # a round a turn; single-turn chats wait
    # its own answer in the history, then the next user turn and the assistant header
    assert asked[1][0][-8:] == ["water", "<|im_end|>", "<|im_start|>", "<unk>", "when",
                                "<|im_end|>", "<|im_start|>", "<unk>"]
    assert [m["content"] for m in first.messages] == ["be brief", "hello", "water", "when",
                                                      "oil", "how"]
    assert second is chats[1]
    # the last turn is answered as any prompt is; every answer before it is trained
    answer = tok.convert_tokens_to_ids(["so", "<|im_end|>"])
    t = tokenize_example(tok, first, response_ids=answer, stop_ids=eos)
    assert tok.decode([i for i, m in zip(t.ids, t.target) if m]).split() == [
        "water", "<|im_end|>", "oil", "<|im_end|>", "so", "<|im_end|>"]


def test_target_regime_answers_every_turn_of_a_sharegpt_file(tmp_path):
    """Two rounds: every chat's first turn, then its last with the target's first answer in
    the history; each chat trains on both of the target's answers, none of the data's."""
    tok = make_tokenizer()
    data = _jsonl(tmp_path / "sharegpt.jsonl", [_sharegpt(i) for i in range(6)])
    section = DataSection(sources=[DataSource(path=str(data), domain="chat")], seq_len=64,
                          regime="target", heldout_per_domain=2)
    rounds = []

    def generate(prompts, temperature, seed):
        rounds.append(len(prompts))
        return [tok.convert_tokens_to_ids(["water", "<|im_end|>"])] * len(prompts)

    train, held = build_rows(section, tok, 0, generate, [tok.eos_token_id])
    assert rounds == [6, 6]
    water = tok.convert_tokens_to_ids("water")
    for rows in (train, held):
        trained = rows.input_ids[:, 1:][rows.loss_mask[:, :-1]].tolist()
        assert trained == [water, tok.eos_token_id] * (len(trained) // 2)
    assert (train.tokens, held.tokens) == (4 * 4, 2 * 4)


# --- a ShareGPT file trains, on its assistant tokens only ---------------------------------------

def test_a_sharegpt_file_trains_on_its_assistant_tokens_only(tmp_path, tiny_dirs, capsys):
    from draftkit.distill.args import DistillArgs
    from draftkit.distill.command import distill, load_config
    from draftkit.distill.trainer import train

    data = _jsonl(tmp_path / "sharegpt.jsonl", [_sharegpt(i) for i in range(8)])
    recipe = tmp_path / "sharegpt.yaml"
    recipe.write_text(yaml.safe_dump({
        "target": str(tiny_dirs[0]), "out_dir": str(tmp_path / "run"), "max_steps": 2,
        "draft": {"derive_layers": [0]},
        "data": {"sources": [{"path": str(data), "domain": "chat", "shape": "sharegpt"}],
                 "seq_len": 64, "heldout_per_domain": 2},
        "train": {"batch_size": 2, "device": "cpu", "warmup_steps": 1},
        "eval": {"every": 2, "batch_size": 4}}))
    distill(DistillArgs(recipe=str(recipe), dry_run=True))
    assert f"recipe {recipe} is valid" in capsys.readouterr().out
    cfg = load_config(str(recipe))
    tok = make_tokenizer()
    answers = {tok.convert_tokens_to_ids(w) for w in "answer . it was so <|im_end|>".split()}
    answers |= {tok.convert_tokens_to_ids(str(d)) for d in range(10)}
    train_rows, held = build_rows(cfg.data, tok, seed=0)
    for rows in (train_rows, held):
        trained = rows.input_ids[:, 1:][rows.loss_mask[:, :-1]]  # the tokens predicted
        assert set(trained.tolist()) <= answers
    # every token of both answers with its end token (4 + 5 a chat), of 6 chats and 2 held out
    assert (train_rows.tokens, held.tokens) == (6 * 9, 2 * 9)
    best = train(cfg, progress=False)
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert best.is_dir() and metrics[-1]["step"] == 2 and "alpha/chat" in metrics[-1]
