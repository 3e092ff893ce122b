"""Speed bars of the decoder (issue 3) on the embedded target with derived drafts.

Greedy, batch 1, runs interleaved and medians reported (draftkit.labs.bench.run_bench):

- our K = 0 tokens/s vs HF ``generate`` tokens/s (bar: >= 1);
- our speculative tokens/s vs HF assisted generation at the same K and draft (bar: >= 1.3);
- measured speedup / speedup predicted from the measured alpha_i, c and v (bar: >= 0.9).

Command (2 CPU cores; drafts are cut from the target in-process unless --draft is given)::

    python eval/benchmarks/reproduce/bench_decoder.py --layers 0,1,2,29 --layers 0,29 --k 2 3 4
    python eval/benchmarks/reproduce/bench_decoder.py --draft drafts/smol-4l --k 3 --json
"""

from __future__ import annotations

import argparse
import json
import sys

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain in two sentences why the sky is blue.",
    "What is 17 times 23? Show your steps.",
]


def main(argv: list[str] | None = None) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftkit.chat import encode_prompt
    from draftkit.labs.bench import format_report, run_bench
    from draftkit.models import resolve_model
    from draftkit.models.derive import derive_by_layers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--draft", action="append", default=[], help="draft directory (repeatable)")
    ap.add_argument("--layers", action="append", default=[],
                    help="cut a draft from these target layers, e.g. 0,1,2,29 (repeatable)")
    ap.add_argument("--k", type=int, nargs="+", default=[3])
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many built-in prompts")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    ref = resolve_model(args.target, "target")
    target = AutoModelForCausalLM.from_pretrained(ref.path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(ref.path)
    drafts = {}
    for spec in args.layers or ([] if args.draft else ["0,1,2,29"]):
        drafts[f"layers {spec}"] = derive_by_layers(target, [int(x) for x in spec.split(",")])
    for path in args.draft:
        drafts[path] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = [encode_prompt(tok, p) for p in PROMPTS[:args.prompts]]
    results = []
    for name, draft in drafts.items():
        for k in args.k:
            r = run_bench(target, draft, prompts, k, args.max_new_tokens, args.repeats,
                          pad_token_id=tok.pad_token_id or tok.eos_token_id,
                          log=lambda s: print(s, file=sys.stderr, flush=True))
            r["draft"] = name
            results.append(r)
            if args.json:
                print(json.dumps(r), flush=True)
            else:
                print(f"== draft {name} (threads {torch.get_num_threads()})")
                print(format_report(r), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
