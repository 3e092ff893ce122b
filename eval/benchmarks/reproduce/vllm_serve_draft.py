"""`vllm serve BUNDLE/draft`: an EAGLE-3 bundle's head folder given to vLLM alone, against plain
decoding of the target it names, greedy, on a suite's first prompts. Runs under vLLM's own
Python (it imports vLLM and transformers, not draftkit)::

    .venv/bin/draftkit export --target embedded --draft runs/quickstart/distill/best \\
        --report runs/quickstart/report.json --dtype float32 --out /tmp/qs-f32
    VLLM_ENABLE_V1_MULTIPROCESSING=0 OMP_NUM_THREADS=2 .venv-vllm/bin/python -I -B \\
        eval/benchmarks/reproduce/vllm_serve_draft.py /tmp/qs-f32 eval/suites/code.jsonl \\
        --dtype float32

Prints the speculative config vLLM resolved from the folder (method, K, draft), the target it
served, and on how many prompts the head's greedy tokens equal plain decoding's.
"""

import argparse
import json
import time

from transformers import AutoTokenizer
from vllm import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("suite")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    config = json.load(open(f"{args.bundle}/draft/config.json"))
    target = config["speculators_config"]["verifier"]["name_or_path"]
    tok = AutoTokenizer.from_pretrained(target)
    rows = [json.loads(line) for line in open(args.suite) if line.strip()][:args.prompts]
    texts = [tok.apply_chat_template([{"role": "user", "content": r["prompt"]}],
                                     add_generation_prompt=True, tokenize=False) for r in rows]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    out = {}
    for name, model in (("head", f"{args.bundle}/draft"), ("plain", target)):
        llm = LLM(model=model, dtype=args.dtype, enforce_eager=True, max_model_len=1024, seed=0,
                  kv_cache_memory_bytes=256 << 20)
        start = time.perf_counter()
        done = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        out[name] = [list(r.outputs[0].token_ids) for r in done]
        spec = llm.llm_engine.vllm_config.speculative_config
        resolved = spec and (spec.method, spec.num_speculative_tokens, spec.model)
        print(f"{name}: speculative config {resolved}, "
              f"target {llm.llm_engine.vllm_config.model_config.model}, "
              f"{time.perf_counter() - start:.1f} s", flush=True)
        del llm
    same = sum(a == b for a, b in zip(out["head"], out["plain"]))
    print(f"greedy equal: {same} of {len(prompts)} prompts ({args.dtype}, "
          f"{sum(map(len, out['head']))} tokens)")


if __name__ == "__main__":
    main()
