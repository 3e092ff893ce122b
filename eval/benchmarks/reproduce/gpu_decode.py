"""End-to-end speculative decoding on a GPU: measured speedup against batch size and alpha.

No real checkpoint can be fetched on the benchmark machine, so the pair is synthetic but costs
what a real one costs: a random-weight target of Llama-3.2-1B's shape (16 layers, 128k vocab)
and a draft made of its first two layers plus its norm and head (``derive_by_layers``). To give
the pair a realistic, tunable acceptance, the residual writes (``o_proj``, ``down_proj``) of the
target's other 14 layers are scaled by ``--agreement`` factors: 0 makes the target compute the
draft's function exactly (alpha = 1, the cost is unchanged), larger factors let the deep layers
move the argmax more (alpha falls). Acceptance is then measured, not assumed.

For each factor and batch size it runs our engine at K = 0, at fixed K and at ``--k auto`` on
the same random prompts (greedy, interleaved repeats, medians) and prints tokens/s, the measured
speedup, alpha, tau, c, v(K) and the speedup the model predicts from them; at batch 1 it also
times HF ``generate`` and assisted generation; each row says how the forwards ran (CUDA graphs
or eager, ``decode_path``; ``DRAFTKIT_CUDA_GRAPHS=0`` times the eager loop). A correctness
check first decodes a small fp32 pair on the device and compares speculative with plain greedy tokens (they must be equal). In
bf16 the per-config ``greedy_equal`` flag can be false: a (K + 1)-token verify and a 1-token
step round differently, and random weights leave many near-ties for the argmax to flip.
Commands::

    python eval/benchmarks/reproduce/gpu_decode.py                        # GPU, bf16, 1B shape
    python eval/benchmarks/reproduce/gpu_decode.py --device cpu --tiny    # smoke test
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def build_pair(tiny: bool, dtype, device, agreement: float, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftkit.models.derive import derive_by_layers

    if tiny:
        shape = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=512, max_position_embeddings=2048,
                     num_hidden_layers=6)
    else:  # Llama-3.2-1B
        shape = dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
                     rope_theta=500000.0, tie_word_embeddings=True, num_hidden_layers=16)
    torch.manual_seed(seed)
    with torch.device(device):
        target = LlamaForCausalLM(LlamaConfig(**shape)).to(dtype).eval()
    with torch.no_grad():
        for layer in target.model.layers[2:]:
            layer.self_attn.o_proj.weight.mul_(agreement)
            layer.mlp.down_proj.weight.mul_(agreement)
    draft = derive_by_layers(target, [0, 1]).to(device)
    return target, draft


def check_exact(device) -> dict:
    """fp32 tiny pair: speculative greedy tokens equal plain greedy tokens, ragged batch."""
    import torch

    from draftkit.decode.engine import SpeculativeEngine

    target, draft = build_pair(True, torch.float32, device, agreement=0.3)
    engine = SpeculativeEngine(target, draft, eos_token_id=None)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (5, 17, 9, 30)]
    plain = [r.tokens for r in engine.generate(prompts, k=0, max_new_tokens=48)]
    alone = [engine.generate([p], k=0, max_new_tokens=48)[0].tokens for p in prompts]
    out = {"batched_equals_alone": plain == alone}
    for k in (1, 3, 6):
        spec = [r.tokens for r in engine.generate(prompts, k=k, max_new_tokens=48)]
        out[f"spec_k{k}_equals_plain"] = spec == plain
    sampled = engine.generate(prompts, k=3, max_new_tokens=48, temperature=1.0, top_p=0.9,
                              seed=0)
    out["sampled_lengths_ok"] = all(len(r.tokens) == 48 for r in sampled)
    return out


def run_engine(engine, prompts, k, max_new_tokens, device):
    from draftkit.decode.clock import synchronize
    from draftkit.decode.stats import DecodeStats

    stats = DecodeStats()
    synchronize(device)
    t0 = time.perf_counter()
    res = engine.generate(prompts, k=k, max_new_tokens=max_new_tokens, stats=stats)
    synchronize(device)
    seconds = time.perf_counter() - t0
    return sum(len(r.tokens) for r in res) / seconds, stats, [r.tokens for r in res]


def run_hf(target, draft, prompt, k, max_new_tokens, device) -> float:
    import torch

    from draftkit.decode.clock import synchronize

    kw = {}
    if draft is not None:
        gc = draft.generation_config
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = k, "constant"
        gc.assistant_confidence_threshold = 0.0
        kw["assistant_model"] = draft
    x = torch.tensor([prompt], device=device)
    synchronize(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = target.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                              max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                              pad_token_id=0, eos_token_id=None, temperature=None, top_p=None,
                              top_k=None, **kw)
    synchronize(device)
    return (out.shape[1] - len(prompt)) / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    import torch

    from draftkit import metrics
    from draftkit.decode.engine import SpeculativeEngine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (smoke test)")
    ap.add_argument("--agreement", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--k", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--hf", action=argparse.BooleanOptionalAction, default=True,
                    help="also time HF generate / assisted generation at batch 1")
    ap.add_argument("--json-out", default=None, help="write every row to this JSON file")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.tiny:
        args.batches = [b for b in args.batches if b <= 4] or [1]
        args.prompt_len, args.max_new_tokens, args.repeats = 16, 24, 1

    print("device:", torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
          "| torch", torch.__version__, flush=True)
    exact = check_exact(device)
    print("exactness (fp32):", json.dumps(exact), flush=True)
    rows = []
    for agreement in args.agreement:
        target, draft = build_pair(args.tiny, dtype, device, agreement)
        engine = SpeculativeEngine(target, draft, eos_token_id=None)
        vocab = target.config.vocab_size
        g = torch.Generator().manual_seed(0)
        pool = [torch.randint(0, vocab, (args.prompt_len,), generator=g).tolist()
                for _ in range(max(args.batches))]
        with torch.inference_mode():
            run_engine(engine, pool[:2], max(args.k), 8, device)  # warm-up
        for b in args.batches:
            prompts = pool[:b]
            modes = [0] + list(args.k) + ["auto"]
            with torch.inference_mode():  # first calls at a new shape pick kernels: untimed
                for m in modes:
                    run_engine(engine, prompts, m, 16, device)
            tps = {m: [] for m in modes}
            stats = {}
            outs = {}
            for _ in range(args.repeats):
                for m in modes:
                    rate, st, toks = run_engine(engine, prompts, m, args.max_new_tokens, device)
                    tps[m].append(rate)
                    stats[m], outs[m] = st, toks
            med = {m: statistics.median(v) for m, v in tps.items()}
            base = stats[0].target_step_seconds(1)
            row = {"agreement": agreement, "batch": b, "tokens_per_s": {str(m): v for m, v in
                                                                       med.items()}}
            for k in args.k:
                st = stats[k]
                c, v = st.c(base), st.v(k, base)
                pred = metrics.speedup(st.alphas() or 0.0, c, k, v) if c and v else None
                row[f"k{k}"] = {"alpha": st.alpha(), "tau": st.tau(), "c": c, "v": v,
                                "measured_speedup": med[k] / med[0], "predicted_speedup": pred,
                                "greedy_equal": outs[k] == outs[0]}
            row["decode_path"] = {str(m): stats[m].path_text() for m in modes}
            row["auto"] = {"measured_speedup": med["auto"] / med[0],
                           "k_mean": stats["auto"].drafted / max(stats["auto"].row_steps, 1),
                           "greedy_equal": outs["auto"] == outs[0]}
            if b == 1 and args.hf:
                hf = [run_hf(target, None, prompts[0], 0, args.max_new_tokens, device)
                      for _ in range(args.repeats)]
                kk = args.k[0]
                hfa = [run_hf(target, draft, prompts[0], kk, args.max_new_tokens, device)
                       for _ in range(args.repeats)]
                row["hf_generate_tps"] = statistics.median(hf)
                row[f"hf_assisted_k{kk}_tps"] = statistics.median(hfa)
            rows.append(row)
            ks = " ".join(
                f"K={k}: {row[f'k{k}']['measured_speedup']:.2f}x (pred "
                f"{row[f'k{k}']['predicted_speedup'] or 0:.2f}, a={row[f'k{k}']['alpha']:.2f}, "
                f"c={row[f'k{k}']['c'] or 0:.3f}, v={row[f'k{k}']['v'] or 0:.2f}, "
                f"eq={row[f'k{k}']['greedy_equal']})" for k in args.k)
            hf_s = ""
            if "hf_generate_tps" in row:
                hf_s = (f" | HF generate {row['hf_generate_tps']:.1f} tok/s, HF assisted "
                        f"{row[f'hf_assisted_k{args.k[0]}_tps']:.1f} tok/s")
            print(f"agree={agreement} B={b:3d} K0 {med[0]:8.1f} tok/s | {ks} | auto "
                  f"{row['auto']['measured_speedup']:.2f}x (mean K "
                  f"{row['auto']['k_mean']:.2f}){hf_s}", flush=True)
        del engine, target, draft
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"exactness": exact, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
