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
from draftkit.errors import ConfigError, DraftkitError


def parse_k(value: str) -> int | str:
    """'auto' or an integer >= 0 (K = 0 is plain decoding)."""
    if str(value).strip().lower() == "auto":
        return "auto"
    try:
        k = int(value)
    except ValueError:
        raise ConfigError(f"--k must be an integer >= 0 or 'auto', got {value!r}") from None
    if k < 0:
        raise ConfigError(f"--k (num_speculative_tokens) must be >= 0, got {k}")
    return k


def check_sampling(temperature: float, top_p: float, top_k: int) -> None:
    if temperature < 0:
        raise ConfigError(f"--temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ConfigError(f"--top-p must lie in (0, 1], got {top_p}")
    if top_k < 0:
        raise ConfigError(f"--top-k must be >= 0 (0 = off), got {top_k}")


@dataclass
class GenerateArgs:
    """Generate text from prompts with the target, speculatively when a draft is given."""

    target: str = option("embedded", help="target model: HF directory, hub id, bundle or "
                                          "'embedded'")
    draft: str | None = option(None, help="draft model (HF directory or bundle); none = plain "
                                          "decoding")
    k: str = option("4", help="drafted tokens per round (num_speculative_tokens), or 'auto' "
                              "to choose per round")
    k_max: int = option(8, help="largest K that --k auto may choose")
    temperature: float = option(0.0, help="sampling temperature; 0 = greedy")
    top_p: float = option(1.0, help="nucleus sampling mass in (0, 1]; 1 = off")
    top_k: int = option(0, help="keep the top-k tokens; 0 = off")
    max_new_tokens: int = option(128, help="new tokens per prompt at most")
    seed: int = option(0, help="random seed for sampling; the same seed repeats the output "
                               "exactly with a fixed --k (with --k auto, K follows measured "
                               "timings, and the draws follow K)")
    prompt: str | None = option(None, help="one prompt (text)")
    prompts: str | None = option(None, help="JSONL file of prompts (string, {\"prompt\"} or "
                                            "{\"messages\"} per line)")
    batch_size: int = option(1, help="prompts decoded together")
    raw: bool = option(False, help="skip the chat template; tokenize the prompt as it is")
    json: bool = option(False, help="print one JSON object per prompt")
    device: str | None = option(None, help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    dtype: str = option("auto", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16")

    def validate(self) -> None:
        parse_k(self.k)
        check_sampling(self.temperature, self.top_p, self.top_k)
        if (self.prompt is None) == (self.prompts is None):
            raise ConfigError("give exactly one of --prompt TEXT or --prompts FILE.jsonl")
        if self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.k_max < 0:
            raise ConfigError(f"--k-max must be >= 0, got {self.k_max}")


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

    k = parse_k(args.k)
    texts = [args.prompt] if args.prompt is not None else read_prompts(args.prompts)
    pair = load_pair(args.target, args.draft, device=args.device, dtype=args.dtype)
    tok = pair.tokenizer
    prompts = [encode_prompt(tok, p, raw=args.raw) for p in texts]
    engine = SpeculativeEngine(pair.target, pair.draft)
    if pair.draft is None and k not in (0, "auto"):
        k = 0
    torch.manual_seed(args.seed)
    records = []
    for i in range(0, len(prompts), args.batch_size):
        batch = prompts[i:i + args.batch_size]
        results = engine.generate(batch, k=k, k_max=args.k_max, max_new_tokens=args.max_new_tokens,
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
