"""Incremental detokenization on the two kinds of tokenizer that split characters into bytes:
byte-level BPE (GPT-2, Llama 3, Qwen) and SentencePiece with byte fallback (Llama 2, Mistral,
Gemma), both built in-process."""

import pytest

from draftkit.serve.detok import TextStream


def byte_level_bpe():
    """GPT-2 style: every byte is a token, no merges; a space is part of the next word."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    vocab["<|endoftext|>"] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>")


def byte_fallback_sentencepiece():
    """Llama 2 style: ``▁`` for a space, ``<0xE4>`` byte tokens for characters outside the
    vocabulary, and the decoder strips the leading space of the first token decoded."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in ("▁", "▁hello", "▁world", "▁ok", "o", "k"):
        vocab[piece] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>",
                                fuse_unk=True))
    core.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                            normalizers.Replace(" ", "▁")])
    core.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                      decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")


def streamed(tok, prompt, ids, stops=None, step=1):
    """The chunks a stream sends when ``ids`` arrive ``step`` at a time."""
    ts = TextStream(tok, stops, prompt)
    chunks = [ts.feed(ids[i:i + step], final=i + step >= len(ids))
              for i in range(0, len(ids), step)]
    return chunks, ts


@pytest.mark.parametrize("make", [byte_level_bpe, byte_fallback_sentencepiece],
                         ids=["byte-level-bpe", "byte-fallback"])
@pytest.mark.parametrize("step", [1, 2, 3])
def test_streamed_text_is_the_decoded_completion(make, step):
    """Whatever the rounds, the chunks join to the text the output adds after the prompt
    (its leading space included), and no chunk holds half a character."""
    tok = make()
    whole = tok("hello world 你 ok 🙂 é", add_special_tokens=False)["input_ids"]
    n = len(tok("hello", add_special_tokens=False)["input_ids"])
    prompt, ids = whole[:n], whole[n:]
    assert tok.decode(prompt) == "hello" and len(ids) > len(" world 你 ok 🙂 é")  # bytes
    chunks, ts = streamed(tok, prompt, ids + [tok.eos_token_id], step=step)
    assert "".join(chunks) == " world 你 ok 🙂 é" and ts.tokens == len(ids) + 1
    assert not any("\ufffd" in c for c in chunks), chunks
    assert TextStream(tok, None, prompt).feed(ids, final=True) == " world 你 ok 🙂 é"


@pytest.mark.parametrize("make", [byte_level_bpe, byte_fallback_sentencepiece],
                         ids=["byte-level-bpe", "byte-fallback"])
def test_a_stop_string_cuts_the_text_and_counts_tokens_up_to_it(make):
    tok = make()
    ids = tok("world 你 ok 🙂 é", add_special_tokens=False)["input_ids"]
    for step in (1, 4, len(ids)):
        chunks, ts = streamed(tok, [], ids, stops=["你 o", "never"], step=step)
        assert "".join(chunks).strip() == "world" and ts.stopped
        # the token that completed the stop: the first of " ok" (byte-level BPE: "o")
        assert ts.tokens == next(n for n in range(len(ids) + 1)
                                 if "你 o" in tok.decode(ids[:n])), step
