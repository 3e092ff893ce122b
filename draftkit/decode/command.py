"""The decoder's command: ``draftkit generate``.

``generate`` decodes prompts with the target, speculatively when given a draft::

    draftkit generate --target embedded --prompt "Write a haiku about rain."
    draftkit generate --target embedded --draft drafts/smol-4l --k 3 --prompt "What is 7 * 8?"
    draftkit generate --target embedded --draft drafts/smol-4l --k auto \\
        --prompts prompts.jsonl --batch-size 8 --temperature 0.7 --top-p 0.9 --json

Prompts go through the target's chat template (``--raw`` skips it). A ``--prompts`` file holds
one JSON value per line: a string, ``{"prompt": "..."}`` or ``{"messages": [...]}``.
"""

from __future__ import annotations

import json
import sys

import torch

from draftkit.chat import encode_prompt, read_prompts
from draftkit.decode.args import GenerateArgs
from draftkit.decode.choice import KChoice
from draftkit.decode.dtype_choice import load_decoding_pair
from draftkit.decode.engine import SpeculativeEngine


def generate(args: GenerateArgs) -> list[dict]:
    """Run the decoder over the prompts; print and return one record per prompt."""
    texts = [args.prompt] if args.prompt is not None else read_prompts(args.prompts)
    pair, chosen = load_decoding_pair(args.target, args.draft, args.device, args.dtype)
    if chosen.step_ms:  # measured: say what auto chose and why
        print(f"[dtype {chosen.describe()}]", file=sys.stderr, flush=True)
    tok = pair.tokenizer
    prompts = [encode_prompt(tok, p, raw=args.raw) for p in texts]
    engine = SpeculativeEngine(pair.target, pair.draft)  # it decodes at K = 0 without a draft
    torch.manual_seed(args.seed)
    records = []
    for i in range(0, len(prompts), args.batch_size):
        batch = prompts[i:i + args.batch_size]
        # K was checked with the arguments; under auto, each batch's policy starts afresh
        k = KChoice.of(args.k, args.k_max, has_draft=pair.draft is not None)
        results = engine.generate(batch, k=k, max_new_tokens=args.max_new_tokens,
                                  temperature=args.temperature, top_k=args.top_k,
                                  top_p=args.top_p, seed=args.seed + i,
                                  draft_sample_method=args.draft_sample_method,
                                  verify=args.verify)
        for r in results:
            rec = {"text": tok.decode(r.tokens, skip_special_tokens=True),
                   "new_tokens": len(r.tokens),
                   "stats": {"target_calls": r.stats.target_calls, "drafted": r.stats.drafted,
                             "accepted": r.stats.accepted, "alpha": r.stats.alpha,
                             "tau": r.tau, "seconds": r.seconds}}
            records.append(rec)
            if args.json:
                print(json.dumps(rec), flush=True)
            else:
                print(rec["text"], flush=True)
                s = rec["stats"]
                print(f"[{rec['new_tokens']} tokens, {s['target_calls']} target calls, "
                      f"tau {s['tau']:.2f}, alpha {s['alpha']:.2f}, "
                      f"{rec['new_tokens'] / max(s['seconds'], 1e-9):.1f} tokens/s]",
                      file=sys.stderr, flush=True)
    return records
