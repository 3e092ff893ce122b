"""``draftkit bench``: tokens/s of our decoder against Hugging Face ``generate``.

Four methods on the same prompts, greedy, batch 1, runs interleaved (so a noisy, shared machine
slows them alike) and medians over repeats reported:

- ``ours_k0``: our engine at K = 0 (plain decoding, no draft work);
- ``ours_spec``: our engine at K drafted tokens;
- ``hf_generate``: ``model.generate`` (greedy);
- ``hf_assisted``: ``model.generate(assistant_model=draft)`` at constant K and confidence
  threshold 0 (``num_assistant_tokens``, ``assistant_confidence_threshold``).

An EAGLE-3 head drafts from the target's hidden states, which HF assisted generation does not
hand a draft: for such a draft ``hf_assisted`` is skipped, and the figures say so (``skipped``).

Plus the measured speedup (ours_spec / ours_k0) against the speedup predicted from the measured
conditional alpha_i, c and v (metrics.speedup): their ratio shows what the loop's own overhead
costs. Command::

    draftkit bench --target embedded --draft drafts/smol-4l --prompts prompts.jsonl --k 3
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from draftkit import metrics
from draftkit.chat import encode_prompt, read_prompts
from draftkit.decode.choice import PLAIN, KChoice
from draftkit.decode.clock import synchronize
from draftkit.decode.dtype_choice import load_decoding_pair
from draftkit.decode.engine import SpeculativeEngine
from draftkit.decode.stats import DecodeStats, path_line
from draftkit.labs.bench_args import METHODS, BenchArgs

NO_ASSISTED = ("HF assisted generation cannot run an EAGLE-3 head (it drafts from the target's "
               "hidden states, which assisted generation does not pass to a draft)")


def run_bench(target, draft, prompts: list[list[int]], k: int, max_new_tokens: int = 64,
              repeats: int = 3, methods: tuple[str, ...] = METHODS, pad_token_id: int | None = None,
              log=None) -> dict:
    """Interleaved greedy benchmark at batch 1; returns medians and the speedup figures."""
    engine = SpeculativeEngine(target, draft)
    skipped = {}
    if "hf_assisted" in methods and engine.draft.aux_layers:  # it reads the target's features
        methods = tuple(m for m in methods if m != "hf_assisted")
        skipped["hf_assisted"] = NO_ASSISTED
        if log:
            log(f"hf_assisted skipped: {NO_ASSISTED}")
    if "hf_assisted" in methods:
        gc = draft.generation_config
        gc.num_assistant_tokens = k
        gc.num_assistant_tokens_schedule = "constant"
        gc.assistant_confidence_threshold = 0.0
    stats = {"ours_k0": DecodeStats(), "ours_spec": DecodeStats()}
    run = _runner(engine, target, draft, k, max_new_tokens, pad_token_id, stats)
    run("ours_spec", prompts[0])  # warm-up: first-call allocations stay out of the figures
    for m in methods:
        run(m, prompts[0][:8] or prompts[0])
    # the warm-up's rounds stay out of the figures too (run reads stats at each call)
    stats.update(ours_k0=DecodeStats(), ours_spec=DecodeStats())
    per_rep = _interleaved(run, engine.device, prompts, methods, repeats, log)
    out = {"k": k, "max_new_tokens": max_new_tokens, "prompts": len(prompts),
           "repeats": repeats, "tokens_per_s": {m: statistics.median(v)
                                                for m, v in per_rep.items()},
           "tokens_per_s_all": per_rep}
    if skipped:
        out["skipped"] = skipped
    # how our forwards ran (CUDA graphs or eager, and why), per method of ours
    out["decode_path"] = {m: stats[m].path() for m in stats if m in methods}
    out.update(_speedups(out["tokens_per_s"], stats, k))
    return out


def _runner(engine, target, draft, k: int, max_new_tokens: int, pad_token_id: int | None,
            stats: dict):
    """``run(method, ids)``: decode one prompt greedily with ``method``; its new tokens."""
    # bench's K was checked with its arguments: a fixed K >= 1
    choices = {"ours_k0": PLAIN, "ours_spec": KChoice.of(k, k, has_draft=True)}

    def run(method: str, ids: list[int]) -> int:
        if method in choices:
            r = engine.generate([ids], k=choices[method], max_new_tokens=max_new_tokens,
                                stats=stats[method])
            return len(r[0].tokens)
        kw = {"assistant_model": draft} if method == "hf_assisted" else {}
        x = torch.tensor([ids], device=engine.device)
        with torch.inference_mode():
            out = target.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                  max_new_tokens=max_new_tokens, pad_token_id=pad_token_id,
                                  temperature=None, top_p=None, top_k=None, **kw)
        return out.shape[1] - len(ids)
    return run


def _interleaved(run, device, prompts: list[list[int]], methods: tuple[str, ...],
                 repeats: int, log=None) -> dict[str, list[float]]:
    """Tokens/s of each method per repeat; every method sees the same machine conditions."""
    per_rep: dict[str, list[float]] = {m: [] for m in methods}
    for rep in range(repeats):
        for m in methods:
            tokens, seconds = 0, 0.0
            for ids in prompts:
                synchronize(device)
                t0 = time.perf_counter()
                tokens += run(m, ids)
                synchronize(device)
                seconds += time.perf_counter() - t0
            per_rep[m].append(tokens / seconds)
            if log:
                log(f"repeat {rep + 1}/{repeats} {m}: {tokens / seconds:.2f} tokens/s")
    return per_rep


def _speedups(tps: dict[str, float], stats: dict, k: int) -> dict:
    """Measured speedup against the one predicted from the measured alpha_i, c and v, and our
    decoder against HF's, for the methods that ran."""
    out = {}
    if "ours_k0" in tps and "ours_spec" in tps:
        base, spec = stats["ours_k0"], stats["ours_spec"]
        t1 = base.target_step_seconds(1)
        alphas = spec.alphas()
        c = spec.c(t1)
        v = spec.v(k, t1)
        out.update({"alpha": spec.alpha(), "alpha_tv": spec.alpha_tv(), "alpha_i": alphas,
                    "tau": spec.tau(), "c": c, "v": v,
                    "overhead_per_round_s": spec.overhead_per_round(),
                    "target_step_s": t1})
        measured = tps["ours_spec"] / tps["ours_k0"]
        predicted = (metrics.speedup(alphas or 0.0, c, k, v, per_round=spec.draft_per_round)
                     if (c and v) else None)
        out.update({"measured_speedup": measured, "predicted_speedup": predicted,
                    "measured_over_predicted": measured / predicted if predicted else None})
    if "ours_k0" in tps and "hf_generate" in tps:
        out["k0_over_hf_generate"] = tps["ours_k0"] / tps["hf_generate"]
    if "ours_spec" in tps and "hf_assisted" in tps:
        out["spec_over_hf_assisted"] = tps["ours_spec"] / tps["hf_assisted"]
    return out


def format_report(r: dict) -> str:
    lines = [f"K = {r['k']}, {r['prompts']} prompts x {r['max_new_tokens']} new tokens, "
             f"{r['repeats']} interleaved repeats (medians)"
             + (f", {r['dtype']}" if r.get("dtype") else "")]
    for m, v in r["tokens_per_s"].items():
        lines.append(f"  {m:<12} {v:8.2f} tokens/s")
    for m, why in r.get("skipped", {}).items():
        lines.append(f"  {m:<12} skipped: {why}")
    for key in ("k0_over_hf_generate", "spec_over_hf_assisted", "measured_speedup",
                "predicted_speedup", "measured_over_predicted", "alpha", "alpha_tv", "tau", "c",
                "v"):
        if r.get(key) is not None:
            lines.append(f"  {key:<24} {r[key]:.3f}")
    if r.get("alpha_i"):
        lines.append("  alpha_i                  " + " ".join(f"{a:.3f}" for a in r["alpha_i"]))
    for m, path in r.get("decode_path", {}).items():
        lines.append(f"  decode path {m:<12} {path_line(path)}")
    return "\n".join(lines)


def bench(args: BenchArgs) -> dict:
    """``draftkit bench``: load the pair, encode the prompts, run, print."""
    pair, chosen = load_decoding_pair(args.target, args.draft, args.device, args.dtype)
    prompts = [encode_prompt(pair.tokenizer, p, raw=args.raw) for p in read_prompts(args.prompts)]
    result = run_bench(pair.target, pair.draft, prompts, args.k, args.max_new_tokens,
                       args.repeats, tuple(args.methods),
                       pad_token_id=pair.tokenizer.pad_token_id or pair.tokenizer.eos_token_id,
                       log=None if args.json else lambda s: print(s, file=sys.stderr))
    result["dtype"] = chosen.describe() or chosen.dtype
    print(json.dumps(result) if args.json else format_report(result))
    return result
