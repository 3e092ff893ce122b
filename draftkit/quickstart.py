"""``draftkit quickstart``: the whole loop on the embedded default target.

This first version loads the embedded target (SmolLM2-135M-Instruct), derives a draft from
it, decodes a few prompts with and without speculation and prints what happened.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from draftkit.config import option

PROMPTS = [
    "Write a Python function that returns the factorial of n.",
    "What is 17 times 23? Show the steps.",
    "Name three uses of a paperclip.",
]


@dataclass
class QuickstartArgs:
    """Run draftkit end to end on the embedded SmolLM2-135M-Instruct target."""

    out: str = option("runs/quickstart", help="output directory")
    layers: list[int] = option([0, 1, 2, 29], help="target layers the draft starts from")
    max_new_tokens: int = option(48, help="tokens to generate per prompt")


def quickstart(args: QuickstartArgs) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from draftkit.chat import encode_prompt
    from draftkit.models import load_model, load_tokenizer, resolve_model
    from draftkit.models.derive import derive_by_layers, save_draft

    torch.manual_seed(0)
    out = Path(args.out)
    t0 = time.perf_counter()
    ref = resolve_model("embedded", "target")
    target = load_model(ref, "target", device="cpu", dtype="float32")
    tokenizer = load_tokenizer(ref)
    print(f"[1/3] target {ref.name}: {target.config.num_hidden_layers} layers, "
          f"{sum(p.numel() for p in target.parameters()) / 1e6:.0f}M parameters "
          f"({time.perf_counter() - t0:.1f}s)")
    draft_dir = out / "draft"
    draft = derive_by_layers(target, args.layers)
    save_draft(draft, tokenizer, draft_dir, force=True)
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    print(f"[2/3] draft from layers {','.join(map(str, args.layers))} -> {draft_dir}")
    print(f"[3/3] decoding {len(PROMPTS)} prompts, greedy, {args.max_new_tokens} new tokens")
    for prompt in PROMPTS:
        ids = torch.tensor([encode_prompt(tokenizer, prompt)])
        t = time.perf_counter()
        plain = target.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False)
        t_plain = time.perf_counter() - t
        t = time.perf_counter()
        spec = target.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False,
                               assistant_model=draft)
        t_spec = time.perf_counter() - t
        new = plain[0, ids.shape[1]:]
        same = torch.equal(plain, spec)
        print(f"\n> {prompt}\n{tokenizer.decode(new, skip_special_tokens=True).strip()}\n"
              f"  plain {len(new) / t_plain:.1f} tok/s, with draft {len(new) / t_spec:.1f} tok/s, "
              f"identical output: {same}")
