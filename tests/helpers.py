"""What the tests share: tiny random models and tokenizer, reference decoders and statistics,
tiny distillation recipes, torchrun launches, a live server, and loading a script outside the
package.

Everything is built in the test process: no downloads. Fixtures stay in the conftest.py files;
this module holds the plain functions they and the tests call.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from draftkit.config import from_dict
from draftkit.decode.choice import KChoice
from draftkit.distill.config import DistillConfig

# --- tiny models and tokenizer ----------------------------------------------------------------
# The tokenizer is a word-level vocabulary over lowercase words, digits and punctuation with
# ChatML special tokens and a chat template, so every code path that renders chat works on it.

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
    return peaked(LlamaForCausalLM(config).eval())


def peaked(model):
    """``model`` with its matrices drawn at scale 0.2: the default init gives near-uniform
    logits; peaked distributions exercise greedy decoding, acceptance and losses
    non-trivially."""
    import torch

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



def make_mistral(layers: int, seed: int, window: int, vocab: int = 100):
    """A tiny random Mistral with a sliding window of ``window`` positions."""
    import torch
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    cfg = MistralConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=256, sliding_window=window)
    return peaked(MistralForCausalLM(cfg).eval())


def make_qwen3(vocab: int, layers: int, seed: int = 0, hidden_size: int = 32, heads: int = 4,
               kv_heads: int = 2, head_dim: int = 16):
    """A tiny Qwen3: head_dim is its own (16 by default, not hidden_size / heads: 8), RoPE base
    1e6."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=vocab, hidden_size=hidden_size,
                         intermediate_size=2 * hidden_size, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads,
                         head_dim=head_dim, max_position_embeddings=512, tie_word_embeddings=True,
                         rope_parameters={"rope_theta": 1e6, "rope_type": "default"},
                         bos_token_id=1, eos_token_id=2, pad_token_id=3)
    return Qwen3ForCausalLM(config).eval()


# vLLM's CPU attention has kernels for head_dim 32 and up (and not the 8 of make_llama's
# default): the engine tests' tiny models are 64 wide with two heads of 32
ENGINE_SHAPE = {"hidden_size": 64, "heads": 2, "kv_heads": 1}


def engine_llama(vocab: int, layers: int, seed: int = 0):
    """A tiny Llama vLLM's CPU build runs."""
    return make_llama(vocab, num_layers=layers, intermediate_size=128, seed=seed,
                      **ENGINE_SHAPE)


def engine_qwen3(vocab: int, layers: int, seed: int = 0):
    """A tiny Qwen3 vLLM's CPU build runs, with peaked distributions."""
    return peaked(make_qwen3(vocab, layers, seed, head_dim=32, **ENGINE_SHAPE))


# --- the decoder's references -----------------------------------------------------------------

def tiny_target_and_draft(vocab_size: int | None = None, target_layers: int = 3, seed: int = 0):
    """A tiny random Llama target and an unrelated 1-layer draft (low acceptance)."""
    v = vocab_size or len(make_tokenizer())
    return make_llama(v, num_layers=target_layers, seed=seed), make_llama(v, num_layers=1,
                                                                          seed=seed + 1)


def noisy_copy(model, scale: float = 0.02, seed: int = 7):
    """The target with small weight noise: a draft that agrees most of the time, so rounds
    accept several tokens and the bonus / catch-up path runs."""
    import torch

    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            if p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=gen) * scale)
    return draft


def hf_greedy(model, prompt: list[int], max_new_tokens: int, eos_token_id=None) -> list[int]:
    """Plain greedy decoding with HF ``generate``: the reference our engine must match."""
    import torch

    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                             dtype=torch.long), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=eos_token_id, pad_token_id=0, temperature=None,
                             top_p=None, top_k=None)
    return out[0, len(prompt):].tolist()


def chi_square_p(observed, expected_probs, min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness of fit; bins expected below ``min_expected`` are pooled.

    observed: (V,) counts; expected_probs: (V,) summing to 1. p = Q(df/2, stat/2).
    """
    import torch

    observed = observed.double()
    expected = expected_probs.double() * observed.sum()
    small = expected < min_expected
    obs = torch.cat([observed[~small], observed[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    if (obs[~keep] > 0).any():
        return 0.0  # a token the target can never produce was produced
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = obs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2))


def exact_marginals(model, prompt: list[int], params, steps: int = 3):
    """Exact distributions of generated tokens 1..steps under warped sampling from ``model``.

    Enumerates every prefix (V^(steps-1) rows at the last step), so keep V small.
    Returns a list of (V,) tensors.
    """
    import torch

    from draftkit.decode.sampling import probabilities

    v = model.config.vocab_size
    prefixes = torch.tensor([prompt])  # (N, P + t)
    weights = torch.ones(1, dtype=torch.float64)  # probability of each prefix
    out = []
    with torch.inference_mode():
        for _ in range(steps):
            logits = model(prefixes).logits[:, -1]  # (N, V)
            p = probabilities(logits, params).double()  # (N, V)
            joint = weights[:, None] * p  # (N, V)
            out.append(joint.sum(0))
            n = prefixes.shape[0]
            prefixes = torch.cat([prefixes.repeat_interleave(v, 0),
                                  torch.arange(v).repeat(n)[:, None]], dim=1)
            weights = joint.reshape(-1)
    return out



def fit_eagle3(target, rows: int = 512, steps: int = 150, seed: int = 0,
               vocab: list[int] | None = None, parallel: int = 0, num_layers: int = 1):
    """An EAGLE-3 head for ``target`` (over its whole vocabulary, or the target ids ``vocab``)
    fitted to the target's greedy continuations of random prompts, its first step only: a
    draft that agrees with the target often enough that rounds accept several tokens (alpha
    about 0.3 on a 4-layer tiny target). ``parallel`` K: a parallel head, fitted at its
    positions 1..K (distill/ttt.parallel_pass); ``num_layers``: its depth."""
    import torch
    import torch.nn.functional as F

    from draftkit.distill.ttt import parallel_pass
    from draftkit.models.eagle3 import from_target
    from draftkit.models.reduced_head import ReducedHead

    v = target.config.vocab_size
    ids = sorted(vocab) if vocab is not None else list(range(v))
    draft = from_target(target, ReducedHead(ids, v), seed=seed, parallel=bool(parallel),
                        num_layers=num_layers)
    to_draft = torch.full((v,), -100, dtype=torch.long)  # target id -> draft id (-100: none)
    to_draft[torch.tensor(ids)] = torch.arange(len(ids))
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(4, v, (rows, 4), generator=gen)
    with torch.no_grad():
        seqs = target.generate(prompts, attention_mask=torch.ones_like(prompts),
                               max_new_tokens=24, do_sample=False, pad_token_id=0,
                               eos_token_id=None, temperature=None, top_p=None, top_k=None)
        out = target(seqs, output_hidden_states=True)
        aux = torch.cat([out.hidden_states[i] for i in draft.aux_layers], -1)  # (R, T, 3 H)
        labels = to_draft[out.logits.argmax(-1)]  # (R, T): the target's next token, as a draft id
    t = seqs.shape[1]
    opt = torch.optim.Adam([p for p in draft.parameters() if p.requires_grad], lr=1e-2)
    pos = torch.arange(t).expand(64, t)
    for _ in range(steps):
        idx = torch.randint(0, rows, (64,), generator=gen)
        if parallel:  # draft position 1 + d at i scores token i + 2 + d
            hs = parallel_pass(draft, aux[idx], seqs[idx], pos, parallel)
            loss = sum(F.cross_entropy(draft.logits(h[:, :t - 1 - d]).reshape(-1, len(ids)),
                                       labels[idx, 1 + d:].reshape(-1)) for d, h in enumerate(hs))
        else:
            logits, _ = draft(aux[idx, :t - 1], seqs[idx, 1:])  # position i scores token i + 2
            loss = F.cross_entropy(logits.reshape(-1, len(ids)), labels[idx, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return draft.eval()


@functools.lru_cache(maxsize=None)
def eagle3_models(parallel: int = 0, num_layers: int = 1):
    """(a 4-layer target (three distinct layers to tap), a random head over every third
    token, a head fitted to the target (:func:`fit_eagle3`)); ``parallel`` K: both parallel
    heads, the fitted one at its positions 1..K; ``num_layers``: the heads' depth."""
    from draftkit.models.eagle3 import from_target
    from draftkit.models.reduced_head import ReducedHead

    target = make_llama(len(make_tokenizer()), num_layers=4, seed=0)
    v = target.config.vocab_size
    head = from_target(target, ReducedHead(list(range(0, v, 3)), v), seed=1,
                       parallel=bool(parallel), num_layers=num_layers)
    fit = {"rows": 256, "steps": 120, "parallel": parallel} if parallel else {}
    fit["num_layers"] = num_layers
    return target, head.eval(), fit_eagle3(target, **fit)


SMALL_VOCAB = 10  # small enough that 20,000 samples test every token's probability


def small_vocab_eagle3(parallel: bool = False, num_layers: int = 1):
    """(a 4-layer target over SMALL_VOCAB tokens with flat distributions, many tokens carrying
    probability, and a random EAGLE-3 head over all of them; ``parallel``: a parallel one;
    ``num_layers``: its depth)."""
    import torch

    from draftkit.models.eagle3 import from_target
    from draftkit.models.reduced_head import ReducedHead

    target = make_llama(SMALL_VOCAB, num_layers=4, seed=3)
    with torch.no_grad():
        target.model.norm.weight.mul_(0.3)
    head = from_target(target, ReducedHead(list(range(SMALL_VOCAB)), SMALL_VOCAB), seed=4,
                       parallel=parallel, num_layers=num_layers)
    return target, head.eval()


def head_marginals(target, head, params, k: int, seed: int = 11, n_rows: int = 20_000):
    """Chi-square p-values of the first three new tokens' marginals, decoded with ``head`` at
    K = ``k`` under ``params`` from ``n_rows`` copies of one prompt, against the target's
    exact ones (:func:`exact_marginals`); and the run's DecodeStats."""
    import torch

    from draftkit.decode.engine import SpeculativeEngine
    from draftkit.decode.stats import DecodeStats

    engine = SpeculativeEngine(target, head, eos_token_id=None)
    prompt, stats = [1, 4, 7], DecodeStats()
    res = engine.generate([prompt] * n_rows, k=k, max_new_tokens=3, seed=seed, stats=stats,
                          temperature=params.temperature, top_k=params.top_k, top_p=params.top_p)
    toks = torch.tensor([r.tokens for r in res])  # (N, 3)
    exact = exact_marginals(target, prompt, params, steps=3)
    return [chi_square_p(torch.bincount(toks[:, i], minlength=SMALL_VOCAB), exact[i])
            for i in range(3)], stats


def save_head(head, folder: Path, target_dir: Path, **kw) -> Path:
    """An EAGLE-3 head saved as distill's best/ is: beside the target it reads, recorded in
    its target.json (commands refuse a loose head that records none)."""
    from draftkit.models.eagle3 import save_eagle3
    from draftkit.models.head_check import record_target
    from draftkit.models.resolve import resolve_model

    save_eagle3(head, folder, **kw)
    record_target(folder, resolve_model(str(target_dir), "target"))
    return Path(folder)


def parallel_head(tmp_path: Path):
    """(an 8-layer tiny target, its folder, a random parallel EAGLE-3 head for it over every
    third token, saved beside it as distill's best/ is)."""
    from draftkit.models.eagle3 import from_target
    from draftkit.models.reduced_head import ReducedHead

    tok = make_tokenizer()
    target = make_llama(len(tok), num_layers=8)
    target_dir = save_model(target, tok, tmp_path / "target")
    head = from_target(target, ReducedHead(list(range(0, len(tok), 3)), len(tok)), seed=1,
                       parallel=True)
    return target, target_dir, save_head(head, tmp_path / "head", target_dir)


def eagle3_greedy_drafts(draft, target, seq: list[int], k: int) -> list[int]:
    """The K tokens an EAGLE-3 head drafts greedily after the committed tokens ``seq``,
    without a cache: one causal pass over [target features of seq ; its own outputs]."""
    import torch

    x = torch.tensor([seq])
    with torch.inference_mode():
        hs = target(x, output_hidden_states=True).hidden_states
        aux = torch.cat([hs[i] for i in draft.aux_layers], -1)[:, :-1]  # positions 0..L-2
        hidden, tokens, out = draft.fuse(aux), x[:, 1:], []
        for _ in range(k):
            h = draft.causal(tokens, hidden, torch.arange(tokens.shape[1])[None])[:, -1:]
            d = draft.reduced_head.expand(draft.logits(h)).argmax(-1)  # (1, 1)
            out.append(int(d))
            hidden, tokens = torch.cat([hidden, h], 1), torch.cat([tokens, d], 1)
    return out


def parallel_greedy_drafts(draft, target, seq: list[int], k: int) -> list[int]:
    """The K tokens a parallel EAGLE-3 head drafts greedily after the committed tokens ``seq``,
    without a cache: one causal pass over [target features of seq ; K - 1 placeholders]."""
    import torch

    x = torch.tensor([seq])
    with torch.inference_mode():
        hs = target(x, output_hidden_states=True).hidden_states
        aux = torch.cat([hs[i] for i in draft.aux_layers], -1)[:, :-1]  # positions 0..L-2
        token, place = draft.placeholder()
        hidden = torch.cat([draft.fuse(aux), place.expand(1, k - 1, -1)], 1)
        tokens = torch.cat([x[:, 1:], torch.full((1, k - 1), token)], 1)
        h = draft.causal(tokens, hidden, torch.arange(tokens.shape[1])[None])[:, -k:]  # d_1..d_K
        return draft.reduced_head.expand(draft.logits(h)).argmax(-1)[0].tolist()


def broken_verify(draft_tokens, q, p, generator=None):
    """Negative control: resamples from p instead of norm(max(0, p - q)) after a rejection."""
    import torch

    from draftkit.decode.sampling import sample
    from draftkit.decode.verify import Verdict, accept_test, leading_accepts

    bsz, k = draft_tokens.shape
    u = torch.rand((bsz, k), generator=generator)
    n = leading_accepts(accept_test(draft_tokens, q, p, u))
    rows = torch.arange(bsz)
    nxt = sample(p[rows, n], generator)
    return Verdict(n, nxt, torch.minimum(p[:, :-1], q).sum(-1))



def broken_block_verify(draft_tokens, q, p, generator=None):
    """Negative control for block verification: after keeping n < K tokens it draws from the
    token rule's residual max(0, p - q) instead of max(0, w_n p - q)."""
    import torch

    from draftkit.decode.sampling import sample, uniform
    from draftkit.decode.verify import Verdict, block_acceptance, residual

    bsz, k = draft_tokens.shape
    h, _ = block_acceptance(draft_tokens, q, p)
    eta = uniform((bsz, k), generator, p.device)
    n = torch.where(eta < h, torch.arange(1, k + 1), 0).amax(-1)
    rows = torch.arange(bsz)
    q_pad = torch.cat([q, q.new_zeros(bsz, 1, q.shape[-1])], dim=1)
    nxt = sample(residual(p[rows, n], q_pad[rows, n]), generator)
    return Verdict(n, nxt, torch.minimum(p[:, :-1], q).sum(-1))

# --- tiny distillation recipes ----------------------------------------------------------------

ROW_WORDS = "the a of to and in is it that for on with as was he she they we you".split()


def distill_rows(tmp_path: Path, n: int = 14) -> Path:
    """A JSONL file of n prompt/response rows of random words, code and math alternating."""
    rng = random.Random(0)
    rows = []
    for i in range(n):
        dom = "code" if i % 2 else "math"
        q = " ".join(rng.choice(ROW_WORDS) for _ in range(4))
        a = " ".join(rng.choice(ROW_WORDS) for _ in range(rng.randint(3, 9)))
        rows.append({"prompt": q, "response": a, "domain": dom})
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def distill_config(tmp_path: Path, tiny_dirs, out: str = "run", **over):
    """A 4-step recipe on the tiny pair (draft: target layers 0 and 3) as a DistillConfig;
    ``over``: dotted keys to set (``**{"loss.divergence": "ce"}``)."""
    target, _ = tiny_dirs
    data = {"out_dir": str(tmp_path / out), "max_steps": 4, "seed": 0, "target": str(target),
            "draft": {"derive_layers": [0, 3]},
            "data": {"sources": [{"path": str(distill_rows(tmp_path))}], "seq_len": 48,
                     "heldout_per_domain": 2,
                     "generate": {"cache_dir": str(tmp_path / "generated")}},
            "loss": {"divergence": "fkl"},
            "train": {"batch_size": 2, "grad_accum": 2, "lr": 1e-2, "warmup_steps": 1,
                      "checkpoint_every": 2, "device": "cpu"},
            "eval": {"every": 2, "batch_size": 4}}
    for key, value in over.items():
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return from_dict(DistillConfig, data, "test")


def distill_loaded(tmp_path, tiny_dirs, **over):
    """(cfg, target, draft, rows): the tiny target and draft loaded, the recipe's rows built."""
    from draftkit.data import build_rows
    from draftkit.models import load_model, load_tokenizer

    cfg = distill_config(tmp_path, tiny_dirs, **over)
    target_dir, draft_dir = tiny_dirs
    target = load_model(str(target_dir), device="cpu", dtype="float32")
    draft = load_model(str(draft_dir), device="cpu", dtype="float32")
    rows, _ = build_rows(cfg.data, load_tokenizer(str(target_dir)), 0)
    return cfg, target, draft, rows



def tiny_recipe(tmp_path: Path, target: Path) -> tuple[Path, Path]:
    """A base recipe on ten code prompts of random words; (recipe, prompts)."""
    import yaml

    rng = random.Random(0)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join(rng.sample(ROW_WORDS, 4)),
                                           "domain": "code"}) + "\n" for _ in range(10)))
    recipe = tmp_path / "tiny_to_2l" / "base.yaml"
    recipe.parent.mkdir()
    recipe.write_text(yaml.safe_dump({
        "target": str(target), "draft": {"derive_layers": [0, 3]},
        "data": {"sources": [{"path": str(prompts)}], "seq_len": 48, "heldout_per_domain": 2,
                 "regime": "target",
                 "generate": {"max_new_tokens": 8, "cache_dir": str(tmp_path / "gen")}},
        "teacher": {"mode": "online"},
        "train": {"batch_size": 2, "device": "cpu"}, "eval": {"batch_size": 4}}))
    return recipe, prompts


# --- vLLM given a head folder alone -------------------------------------------------------------

_SERVE_DRAFT_ALONE = """
import json, sys
from vllm import LLM, SamplingParams
draft, prompts, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
llm = LLM(model=draft, dtype="float32", enforce_eager=True, max_model_len=256, seed=0,
          kv_cache_memory_bytes=64 << 20)
config = llm.llm_engine.vllm_config
spec = config.speculative_config
outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                    SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
print(json.dumps({"target": config.model_config.model, "method": spec.method,
                  "k": spec.num_speculative_tokens, "draft": spec.model,
                  "tokens": [list(o.outputs[0].token_ids) for o in outs]}))
"""


def serve_draft_alone(python: Path, draft: Path, prompts: list[list[int]], n: int) -> dict:
    """What `vllm serve DRAFT` loads, in vLLM's environment: the target the head folder's
    config names, with the head at its K; greedy ``n`` tokens of each prompt. {target, method,
    k, draft, tokens}. (The CPU build's `vllm` command cannot start; its engine can.)"""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([str(python), "-I", "-B", "-c", _SERVE_DRAFT_ALONE, str(draft),
                           json.dumps(prompts), str(n)], capture_output=True, text=True,
                          timeout=400, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- torchrun launches ---------------------------------------------------------------------------

def free_port() -> int:
    """A port nothing holds: fixed ports collided when two sessions ran this file at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args, timeout, env=None):
    """``torchrun --nproc_per_node 2 ARGS``; (return code, stdout, stderr, seconds).

    A rank stuck in a collective fails by itself after $DRAFTKIT_DIST_TIMEOUT (conftest: 60 s)
    and torchrun (--max-restarts 0) stops the other. ``timeout`` is for a rank stuck outside
    any collective: then torchrun gets SIGINT, which it passes to each rank, so each prints
    where it was, and it SIGKILLs what is left after --shutdown-timeout. subprocess.run's
    timeout SIGKILLed torchrun alone and left the ranks running: they sit in sessions of their
    own, out of reach of a kill of torchrun's group."""
    import psutil  # a dependency of deepspeed

    env = dict(os.environ, WANDB_MODE="disabled", OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd(),
               **(env or {}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(free_port()), "--max-restarts", "0", "--shutdown-timeout", "10",
           "--tee", "3", *map(str, args)]  # --tee: each rank's lines start [default<rank>]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    with contextlib.suppress(subprocess.TimeoutExpired):
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err, time.perf_counter() - t0
    ranks = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        for p in [psutil.Process(proc.pid), *ranks]:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        out, err = proc.communicate()
    pytest.fail(f"torchrun did not finish in {timeout} s, so it was stopped (SIGINT to every "
                f"rank):\n{rank_tails(out, err)}{build_locks()}", pytrace=False)


def rank_tails(out, err, n=15) -> str:
    """Each rank's last lines, then the launcher's verdict (which rank failed first)."""
    lines = (out + err).splitlines()
    said = []
    for rank in (0, 1):
        mine = [x.split(":", 1)[1] for x in lines if x.startswith(f"[default{rank}]:")]
        said.append(f"rank {rank}, last lines:\n  " + "\n  ".join(mine[-n:] or ["(nothing)"]))
    root = [i for i, x in enumerate(lines) if x.startswith("Root Cause")]
    if root:
        said.append("torchrun's first failure: " + "; ".join(
            " ".join(x.split()) for x in lines[root[0]:root[0] + 6]
            if x.strip().startswith(("rank", "exitcode"))))
    return "\n".join(said)


def build_locks() -> str:
    """A torch extension build lock left by a killed DeepSpeed start, which every later one
    waits on forever (torch's FileBaton has no timeout)."""
    from torch.utils.cpp_extension import get_default_build_root

    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    locks = [*root.glob("*/lock"), *root.glob("*/*/lock")]
    return "".join(f"\n{lock} exists: if no build is running, delete it" for lock in locks)


# --- a live server ------------------------------------------------------------------------------

class LiveServer:
    """uvicorn serving ``app`` on 127.0.0.1 in a thread; ``url`` is the API base."""

    def __init__(self, app):
        import uvicorn

        port = free_port()
        self.app = app
        self.base = f"http://127.0.0.1:{port}"
        self.url = f"{self.base}/v1"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                                    log_level="warning",
                                                    timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)

    @property
    def scheduler(self):
        return self.app.state.scheduler

    def client(self):
        import openai

        return openai.OpenAI(base_url=self.url, api_key="x", max_retries=0, timeout=60)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)


def start_server(tiny_models, **kw) -> LiveServer:
    from draftkit.decode.engine import SpeculativeEngine
    from draftkit.serve.app import create_app

    tok, target, draft = tiny_models
    fast = kw.pop("fast_path", None)
    engine = SpeculativeEngine(target, draft, fast_path=fast)
    kw.setdefault("model_name", "tiny")
    return LiveServer(create_app(engine, tok, **kw))


# --- scripts outside the package -----------------------------------------------------------------

def load_script(path: Path):
    """A script outside the package (eval/benchmarks, recipes/data) as a module."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_eval_report(tmp_path: Path, sweep, temperature: float = 0.7, **extra) -> Path:
    """An eval report.json with a batch sweep of (batch size, K, measured speedup, predicted
    speedup) rows; batch 1 carries its interval, as eval writes it; ``extra``: more keys of
    the report, and of its code domain under ``code``."""
    rows = [{"batch_size": b, "alpha": 0.6, "c": 0.2, "v": 1.0, "k": k,
             "plain_tokens_per_s": 10.0, "spec_tokens_per_s": 10.0 * s,
             "speedup_predicted": p, "speedup_measured": s,
             **({"speedup_low": s - 0.1, "speedup_high": s + 0.1} if b == 1 else {})}
            for b, k, s, p in sweep]
    path = tmp_path / "report.json"
    path.write_text(json.dumps({
        "overall": {"k": 3}, "device": "cpu", "dtype": "float32", "temperature": temperature,
        "domains": {"code": {"alpha": 0.6, "tau": 2.1, "c": 0.2, "k": 3,
                             **extra.pop("code", {})}},
        "batch_sweep": rows, "break_even": {"kind": "crosses", "x": 6.0, "batch_size": 8},
        **extra}))
    return path


BATCH_SWEEP = [(1, 3, 1.5, 1.4), (2, 3, 1.3, 1.2), (4, 2, 1.1, 1.05), (8, 2, 0.9, 0.95),
         (16, 1, 0.7, 0.8)]


def write_manifest(bundle: Path, manifest: dict | None = None, **fields) -> dict:
    """Write ``bundle``/draftkit.json sealed with its own hash, as export writes it: the
    ``manifest`` given (a test's edit of a real one) or a minimal one with ``fields``. A signed
    bundle is signed again with the tests' key (a forger who holds the key): the edit reaches
    the checks after the signature's."""
    from draftkit.bundle_checks import SIGNATURE
    from draftkit.manifest import NAME, seal
    from draftkit.signing import KEY_ENV, Signer

    if manifest is None:
        manifest = {"target": {}, "draft": {}, "files": {}, "num_speculative_tokens": 0,
                    **fields}
    manifest = seal(manifest)
    (bundle / NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    if (bundle / SIGNATURE).is_file():
        Signer(Path(os.environ[KEY_ENV])).sign(bundle)
    return manifest


def reseal(bundle: Path, vllm_json: bool = True) -> dict:
    """``bundle`` made consistent again after a test edited its files, as an exporter at its
    place would write it: serving/vllm.json naming this bundle's own draft/, every file
    rehashed, the manifest resealed (and signed with the tests' key): the edit reaches the
    checks after the hashes'."""
    from draftkit.io import sha256_file

    spec = bundle / "serving" / "vllm.json"
    if spec.is_file() and vllm_json:  # False: a test's own edit of it
        spec.write_text(json.dumps({**json.loads(spec.read_text()),
                                    "model": str(bundle / "draft")}))
    manifest = json.loads((bundle / "draftkit.json").read_text())
    manifest["files"] = {rel: sha256_file(bundle / rel) for rel in manifest["files"]}
    return write_manifest(bundle, manifest)


def forge(bundle: Path, key_folder: Path) -> None:
    """:func:`reseal`, then signed by a key of a forger's own (recorded in the manifest, as an
    honest export records its signer)."""
    from draftkit.signing import Signer, new_key_pair

    manifest = reseal(bundle)
    forger = Signer(new_key_pair(key_folder)[0])
    manifest["signing"] = forger.entry().to_dict()
    write_manifest(bundle, manifest)
    forger.sign(bundle)


def fake_engines(tmp_path: Path, vllm: str = "0.34.0", sglang: str = "0.5.23") -> dict:
    """An environment whose ``vllm`` and ``python`` are stand-ins that print the arguments
    they were given, one a line: what a bundle's serving scripts would launch. Asked for their
    release (``vllm --version``, ``python -c ...``, as the scripts ask), they answer ``vllm`` /
    ``sglang`` ("" as not installed)."""
    import os

    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    for name, asked, release in (("vllm", "--version", vllm), ("python", "-c", sglang)):
        answer = f'echo "{release}"' if release else "exit 1"
        (fake / name).write_text(f'#!/usr/bin/env bash\nif [ "$1" = "{asked}" ]; then '
                                 f'{answer}; exit; fi\nprintf "%s\\n" "$@"\n')
        (fake / name).chmod(0o755)
    return {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}


class ScriptedK:
    """A K policy a test scripts, for a batch driven round by round: ``choose`` (as
    :class:`~draftkit.decode.policy.KPolicy`'s) takes the next K of what :meth:`play` was
    given; ``choice`` is the :class:`~draftkit.decode.choice.KChoice` a batch opens with, up to
    ``k_max``."""

    def __init__(self, k_max: int, ks=0):
        self.k_max = k_max
        self.choice = KChoice(k_max=k_max, policy=self)
        self.play(ks)

    def play(self, ks) -> ScriptedK:
        """From the next round on, the K of ``ks``: an int (every round) or an iterable of
        them."""
        self._ks = itertools.repeat(ks) if isinstance(ks, int) else iter(ks)
        return self

    def choose(self, batch: int) -> int:
        k = next(self._ks)
        assert 0 <= k <= self.k_max, f"K = {k} beyond the batch's {self.k_max}"
        return k

    def observe(self, r) -> None:
        """Nothing to learn: the script decides."""


def decodes_alone_as_batched(engine, prompts, reference, k, max_new_tokens):
    """Assert the engine's batched tokens and each prompt's alone equal ``reference``; returns
    the batched run's stats."""
    from draftkit.decode.stats import DecodeStats

    stats = DecodeStats()
    batched = engine.generate(prompts, k=k, max_new_tokens=max_new_tokens, stats=stats)
    assert [r.tokens for r in batched] == reference
    for p, ref in zip(prompts, reference):
        assert engine.generate([p], k=k, max_new_tokens=max_new_tokens)[0].tokens == ref
    if k == 0:
        assert stats.draft_steps == 0 and stats.drafted == 0
    return stats


def slots_decode_as_the_target(engine, prompts, k: int) -> None:
    """Rows join a running batch of an EAGLE-3 head (their prompts' features wait while the
    others draft) and leave it, at K up to ``k``: assert each greedy row produces exactly the
    target's own tokens, a freed slot starting afresh."""
    import torch

    from draftkit.decode.sampling import SamplingParams

    target, (a, b, c), d = engine.target_model, prompts, [60, 61, 62]
    script = ScriptedK(k, k)
    with torch.inference_mode():
        state = engine.open(3, script.choice, max_len=96)
        (sa,) = state.admit([a], SamplingParams(), 20)
        (sb,) = state.admit([b], SamplingParams(0.9), 30, [1])
        for _ in range(3):
            state.step()
        (sc,) = state.admit([c], SamplingParams(), 12)  # joins mid-flight
        script.play(2)
        state.step()
        state.release(sb)
        (sd,) = state.admit([d], SamplingParams(), 15)  # the freed slot
        assert sd == sb and engine.draft.features[sd] and engine.draft.lengths[sd] == 0
        script.play(itertools.cycle(range(k + 1)))
        while state.live:
            state.step()
    for slot, prompt, n in ((sa, a, 20), (sc, c, 12), (sd, d, 15)):
        assert state.output(slot).tokens == hf_greedy(target, prompt, n)
    assert state.output(sa).stats.accepted > 0


def drafts_are_the_heads_own(engine, prompts, ks: list[int], drafts) -> list[int]:
    """Decode ``prompts`` greedily round by round at the K of ``ks`` (cycled; 0: plain rounds,
    after which the head catches up), asserting every row's drafted block equals
    ``drafts(head, target, committed tokens, K)`` (a cacheless reference) and the output the
    target's own; returns the K of every block checked."""
    import torch

    from draftkit.decode.sampling import SamplingParams

    head, target, checked = engine.draft_model, engine.target_model, []
    with torch.inference_mode():
        batch = engine.start(prompts, SamplingParams(), 20,
                             k=ScriptedK(max(ks), itertools.cycle(ks)).choice)
        real = batch._draft

        def spy(rows, lengths, k):  # a fixed batch: slot b holds prompt b
            seqs = [prompts[b] + batch.output(b).tokens for b in rows]  # the committed tokens
            drafted, q = real(rows, lengths, k)
            for b, seq, d in zip(rows, seqs, drafted.tolist()):
                if not batch.output(b).done:
                    assert d == drafts(head, target, seq, k), (b, len(seq), k)
                    checked.append(k)
            return drafted, q

        batch._draft = spy
        while not batch.finished:
            batch.step()
    assert [r.tokens for r in batch.results()] == [hf_greedy(target, p, 20) for p in prompts]
    return checked

