"""How c, verify inflation v and the per-round overhead change with batch size (GPU).

A random-weight target of Llama-3.2-1B's shape and a 2-layer draft of the same width run
through our fast path (draftkit.decode.runners.LlamaRunner, static KV cache) at batch sizes
1..64 and a fixed context. For each batch size it prints:

- T_target(1), T_target(K + 1) and v(K) = T_target(K + 1) / T_target(1) for each K,
- T_draft(1) and c = T_draft / T_target(1),
- the engine's per-round overhead outside the forwards (sampling, acceptance, bookkeeping),
- the speedup the model predicts at a few alpha values with the measured c and v, and its best K.

Random weights make acceptance meaningless, so alpha is an input here, not a measurement.
Commands::

    python eval/benchmarks/reproduce/gpu_batch_sweep.py                       # GPU, bf16, 1B shape
    python eval/benchmarks/reproduce/gpu_batch_sweep.py --device cpu --tiny   # smoke test
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def build(tiny: bool, dtype, device):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if tiny:
        shape = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024)
        layers = 4
    else:  # Llama-3.2-1B
        shape = dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
                     rope_theta=500000.0, tie_word_embeddings=True)
        layers = 16
    torch.manual_seed(0)
    models = []
    for n in (layers, 2):
        cfg = LlamaConfig(num_hidden_layers=n, **shape)
        with torch.device(device):
            m = LlamaForCausalLM(cfg).to(dtype).eval()
        models.append(m)
    return models


def time_forward(runner, batch: int, tokens: int, context: int, repeats: int, device) -> float:
    """Median seconds of one forward of ``tokens`` tokens per row after ``context`` cached."""
    import torch

    from draftkit.decode.clock import synchronize

    runner.reset(batch, context + tokens + 8)
    vocab = runner.vocab_size
    ctx = torch.randint(0, vocab, (batch, context), device=device)
    x = torch.randint(0, vocab, (batch, tokens), device=device)
    runner.forward(ctx, [0] * batch, last=[context - 1] * batch)
    times = []
    for _ in range(repeats + 2):
        synchronize(device)
        t0 = time.perf_counter()
        runner.forward(x, [context] * batch)
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])  # the first two calls warm up kernels


def main(argv: list[str] | None = None) -> int:
    import torch

    from draftkit import metrics
    from draftkit.decode.engine import SpeculativeEngine
    from draftkit.decode.runners import LlamaRunner
    from draftkit.decode.stats import DecodeStats

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="default bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (smoke test)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--k", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.5, 0.7, 0.9])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else (
        torch.bfloat16 if device.type == "cuda" else torch.float32)
    if args.tiny:
        args.context = min(args.context, 64)
        args.batches = [b for b in args.batches if b <= 8] or [1]
        args.repeats = min(args.repeats, 3)
    target, draft = build(args.tiny, dtype, device)
    t_run, d_run = LlamaRunner(target), LlamaRunner(draft)
    engine = SpeculativeEngine(target, draft, eos_token_id=None)  # random weights: never stop
    rows = []
    with torch.inference_mode():
        for b in args.batches:
            t1 = time_forward(t_run, b, 1, args.context, args.repeats, device)
            td = time_forward(d_run, b, 1, args.context, args.repeats, device)
            c = td / t1
            v = {k: time_forward(t_run, b, k + 1, args.context, args.repeats, device) / t1
                 for k in args.k}
            # per-round overhead: a short engine run at the middle K, time outside forwards
            k_mid = args.k[len(args.k) // 2]
            stats = DecodeStats()
            prompt = torch.randint(0, t_run.vocab_size, (args.context,)).tolist()
            engine.generate([prompt] * b, k=k_mid, max_new_tokens=4 * (k_mid + 1), stats=stats)
            overhead = stats.overhead_per_round()
            pred = {}
            for a in args.alphas:
                best_k, best_s = 0, 1.0
                for k in args.k:
                    s = metrics.speedup(a, c, k, v[k], overhead / t1)
                    if s > best_s:
                        best_k, best_s = k, s
                pred[a] = {"k": best_k, "speedup": best_s}
            row = {"batch": b, "t_target_s": t1, "t_draft_s": td, "c": c, "v": v,
                   "overhead_per_round_s": overhead, "overhead_over_target": overhead / t1,
                   "predicted": pred}
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                vs = " ".join(f"v({k})={x:.2f}" for k, x in v.items())
                ps = " ".join(f"a={a}:K={p['k']},{p['speedup']:.2f}x" for a, p in pred.items())
                print(f"B={b:3d} T_target={t1 * 1e3:7.2f}ms T_draft={td * 1e3:6.2f}ms c={c:.3f} "
                      f"{vs} overhead={overhead * 1e3:.2f}ms ({overhead / t1:.2f} target steps) "
                      f"| {ps}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
