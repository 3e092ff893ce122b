"""``draftkit generate``: decode prompts with the target, speculatively when given a draft.

Commands::

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
from dataclasses import dataclass
from pathlib import Path

from draftkit.config import option
from draftkit.decode.args import DecodingArgs
from draftkit.errors import ConfigError, DraftkitError


@dataclass
class GenerateArgs(DecodingArgs):
    """Generate text from prompts with the target, speculatively when a draft is given."""

    target: str = option("embedded", help="target model: HF directory, hub id, bundle or "
                                          "'embedded'")
    draft: str | None = option(None, help="draft model (HF directory or bundle); none = plain "
                                          "decoding")
    max_new_tokens: int = option(128, help="new tokens per prompt at most")
    prompt: str | None = option(None, help="one prompt (text)")
    prompts: str | None = option(None, help="JSONL file of prompts (string, {\"prompt\"} or "
                                            "{\"messages\"} per line)")
    batch_size: int = option(1, help="prompts decoded together")
    raw: bool = option(False, help="skip the chat template; tokenize the prompt as it is")
    json: bool = option(False, help="print one JSON object per prompt")
    device: str | None = option(None, help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    dtype: str = option("auto", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16")

    def validate(self) -> None:
        super().validate()
        if (self.prompt is None) == (self.prompts is None):
            raise ConfigError("give exactly one of --prompt TEXT or --prompts FILE.jsonl")
        if self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {self.batch_size}")


def read_prompts(path: str | Path) -> list:
    """Prompts from a JSONL file: strings, {"prompt": ...} or {"messages": [...]} per line."""
    path = Path(path)
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise DraftkitError(f"prompts file {path} {what}; pass a JSONL file")
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise DraftkitError(f"{path}:{i} is not valid JSON; write one JSON value per "
                                f"line") from None
        if isinstance(row, dict):
            row = row.get("messages", row.get("prompt"))
        if not isinstance(row, (str, list)) or not row:
            raise DraftkitError(f"{path}:{i}: expected a non-empty string, {{\"prompt\": ...}} "
                                f"or {{\"messages\": [...]}}")
        out.append(row)
    if not out:
        raise DraftkitError(f"{path} holds no prompts")
    return out


def generate(args: GenerateArgs) -> list[dict]:
    """Run the decoder over the prompts; print and return one record per prompt."""
    import torch

    from draftkit.chat import encode_prompt
    from draftkit.decode.engine import SpeculativeEngine
    from draftkit.models import load_pair

    texts = [args.prompt] if args.prompt is not None else read_prompts(args.prompts)
    pair = load_pair(args.target, args.draft, device=args.device, dtype=args.dtype)
    tok = pair.tokenizer
    prompts = [encode_prompt(tok, p, raw=args.raw) for p in texts]
    engine = SpeculativeEngine(pair.target, pair.draft)  # it decodes at K = 0 without a draft
    torch.manual_seed(args.seed)
    records = []
    for i in range(0, len(prompts), args.batch_size):
        batch = prompts[i:i + args.batch_size]
        results = engine.generate(batch, k=args.k, k_max=args.k_max,
                                  max_new_tokens=args.max_new_tokens,
                                  temperature=args.temperature, top_k=args.top_k,
                                  top_p=args.top_p, seed=args.seed + i)
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
