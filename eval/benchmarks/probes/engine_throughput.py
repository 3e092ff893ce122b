"""The target's answers and features in vLLM against draftkit's own engine, on one machine.

For work that outgrows one process (recipes/eagle3-at-scale.md), draftkit has vLLM answer the
training prompts (``data.generate.engine: vllm``) and capture the target's hidden states
(``teacher.features: vllm``). This times both engines on the same work, in rounds that alternate
which engine goes first. Each engine is loaded once and kept warm, so start-up is not counted.

- answers: ``--prompts`` training prompts (code and math), greedy, ``--tokens`` new tokens each,
  ``--batch`` requests in flight;
- features: the same prompts, each followed by its answer, one prefill each, at the layers an
  EAGLE-3 head taps ([2, L // 2, L - 3]).

It prints tokens/s for each engine and round, the median, and vLLM's rate over draftkit's with a
95% bootstrap interval over the rounds. It also checks that the greedy answers are the same
tokens. Command (both cores; nothing else running)::

    python eval/benchmarks/probes/engine_throughput.py --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def main(argv: list[str] | None = None) -> int:
    import tempfile

    import torch

    from draftkit.chat import encode_prompt, read_prompts
    from draftkit.data.generate import answer_stop_ids, engine_answers
    from draftkit.distill.features import VllmFeatures, target_forward
    from draftkit.engines.vllm import VllmWorker
    from draftkit.metrics import bootstrap
    from draftkit.models import load_model, load_tokenizer
    from draftkit.models.eagle3 import default_aux_layers
    from draftkit.models.resolve import resolve_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)

    ref = resolve_model(args.target, "target")
    tok = load_tokenizer(ref, "target")
    model = load_model(ref, "target", "cpu", "float32")
    texts = [p for name in ("code", "math") for p in
             read_prompts(ROOT / "eval" / "train_prompts" / f"{name}.jsonl")]
    prompts = [encode_prompt(tok, t) for t in texts[:args.prompts]]
    stop = answer_stop_ids(model, tok)
    layers = default_aux_layers(model.config.num_hidden_layers)
    seeds = list(range(len(prompts)))

    work = Path(tempfile.mkdtemp(prefix="engine-throughput-"))
    worker = VllmWorker(log=work / "vllm.log")
    worker.call("load", name="target", model=str(ref.path), dtype="float32",
                max_model_len=max(map(len, prompts)) + args.tokens + 8,
                max_num_seqs=args.batch)
    features = VllmFeatures(ref.path, "float32", layers, work / "features")
    print(f"{worker.info.label} against draftkit, {ref.name}, {len(prompts)} prompts, "
          f"{args.tokens} new tokens, batch {args.batch}, layers {layers}")

    def vllm_answers():
        out = worker.call("generate", name="target", prompts=prompts, seeds=seeds, each=False,
                          sampling={"temperature": 0.0, "max_tokens": args.tokens,
                                    "stop_token_ids": stop, "ignore_eos": True})
        return [o["tokens"] for o in out["outputs"]]

    def draftkit_answers():
        got = dict(engine_answers(model, prompts, args.tokens, 0.0, stop, seeds, args.batch))
        return [got[i] for i in range(len(prompts))]

    answers = draftkit_answers()  # also a warm-up
    vllm_first = vllm_answers()
    same = sum(a == b for a, b in zip(answers, vllm_first))
    print(f"greedy answers equal in both engines: {same}/{len(prompts)}")
    sequences = [p + a for p, a in zip(prompts, answers)]
    features.capture(sequences[:2])  # warm-up: the engine's load

    def vllm_features():
        return features.capture(sequences)

    def draftkit_features():
        with torch.no_grad():
            return [target_forward(model, layers, torch.tensor([s]),
                                   torch.arange(len(s))[None], None)[1] for s in sequences]

    work_tokens = {"answers": sum(map(len, answers)), "features": sum(map(len, sequences))}
    jobs = {"answers": (vllm_answers, draftkit_answers),
            "features": (vllm_features, draftkit_features)}
    rates: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for job, (theirs, ours) in jobs.items():
            order = [("vllm", theirs), ("draftkit", ours)]
            for engine, fn in (order if r % 2 == 0 else order[::-1]):
                t = time.perf_counter()
                fn()
                rate = work_tokens[job] / (time.perf_counter() - t)
                rates.setdefault((job, engine), []).append(rate)
                print(f"round {r}: {job:8s} {engine:8s} {rate:8.1f} tok/s", flush=True)
    for job in jobs:
        v, d = rates[job, "vllm"], rates[job, "draftkit"]
        ratio = [a / b for a, b in zip(v, d)]
        est, low, high = bootstrap(lambda idx: statistics.median(ratio[i] for i in idx),
                                   len(ratio), resamples=2000)
        print(f"{job}: vLLM {statistics.median(v):.1f} tok/s, draftkit "
              f"{statistics.median(d):.1f} tok/s; vLLM / draftkit {est:.2f}x "
              f"(95% {low:.2f}-{high:.2f}x over {len(ratio)} rounds)")
    features.close()
    worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
