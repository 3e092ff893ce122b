"""Tiny random models and a tiny tokenizer, built in the test process (no downloads).

The tokenizer is a word-level vocabulary over lowercase words, digits and punctuation with
ChatML special tokens and a chat template, so every code path that renders chat works on it.
"""

from __future__ import annotations

from pathlib import Path

WORDS = ("the a an of to and in is it that for on with as was he she they we you i be this "
         "are by at from or have not but what all were when can there use each which do how "
         "if will up out many then them these so some her would make like him into time has "
         "look two more write go see number no way could people my than first water been call "
         "who oil its now find long down day did get come made may part def return print "
         "import class x y z 0 1 2 3 4 5 6 7 8 9 + - * / = ( ) : , . ? ! ' \" hello world "
         "python code math sum answer question translate story poem").split()
SPECIAL = ["<unk>", "<|im_start|>", "<|im_end|>", "<pad>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + ' ' + "
    "message['content'] + ' <|im_end|> ' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant ' }}{% endif %}")


def make_tokenizer(extra_words: tuple[str, ...] = ()):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = list(dict.fromkeys(WORDS + list(extra_words)))
    vocab = {tok: i for i, tok in enumerate(SPECIAL + words)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>",
                                  bos_token="<|im_start|>", eos_token="<|im_end|>",
                                  pad_token="<pad>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def make_llama(vocab_size: int, num_layers: int = 2, hidden_size: int = 32, seed: int = 0,
               intermediate_size: int = 64, heads: int = 4, kv_heads: int = 2,
               tie: bool = True):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size,
                         intermediate_size=intermediate_size, num_hidden_layers=num_layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=256, tie_word_embeddings=tie,
                         bos_token_id=1, eos_token_id=2, pad_token_id=3)
    model = LlamaForCausalLM(config).eval()
    # Default init gives near-uniform logits; a larger scale makes distributions peaked enough
    # that greedy decoding, acceptance and losses are exercised non-trivially.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    return model


def save_model(model, tokenizer, path: Path) -> Path:
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def tiny_pair(tmp_path: Path, target_layers: int = 4, seed: int = 0):
    """A saved tiny target and a 2-layer tiny draft of the same vocabulary: (target, draft)."""
    tok = make_tokenizer()
    target = make_llama(len(tok), num_layers=target_layers, seed=seed)
    draft = make_llama(len(tok), num_layers=1, seed=seed + 1)
    return (save_model(target, tok, tmp_path / "target"),
            save_model(draft, tok, tmp_path / "draft"))
