"""The target's own responses to domain prompts, generated once and cached on disk.

DistillSpec (arXiv 2310.08461) finds target-generated data better than fixed text: the draft
learns the distribution it will be asked to match when serving. Generation is batched HF
``generate`` with left padding; every finished batch is appended to a JSONL cache, so a killed
run resumes where it stopped and a second run with the same target and settings reuses it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from draftkit.io import append_jsonl


def prompt_key(prompt_ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest()[:20]


def cache_file(cache_dir: Path, target_name: str, max_new_tokens: int, temperature: float,
               seed: int) -> Path:
    """One file per (target, settings): changing them never mixes responses."""
    tag = hashlib.sha256(f"{target_name}|{max_new_tokens}|{temperature}|{seed}".encode())
    return Path(cache_dir) / f"responses-{tag.hexdigest()[:12]}.jsonl"


def read_cache(path: Path) -> dict[str, list[int]]:
    """Responses already generated; a torn last line (killed mid-write) is ignored."""
    done: dict[str, list[int]] = {}
    if not path.is_file():
        return done
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            done[row["key"]] = row["response_ids"]
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return done


def generate_responses(model: Any, tokenizer: Any, prompts: list[list[int]], path: Path,
                       max_new_tokens: int, batch_size: int, temperature: float = 0.0,
                       seed: int = 0, progress: bool = True) -> list[list[int]]:
    """Response ids for each prompt (ids up to and including EOS), from the cache or generated.

    prompts: lists of token ids (already rendered through the chat template).
    """
    done = read_cache(path)
    keys = [prompt_key(p) for p in prompts]
    todo = [i for i, k in enumerate(keys) if k not in done]
    # Longest first: batches of similar length waste less padding.
    todo.sort(key=lambda i: -len(prompts[i]))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else \
        tokenizer.eos_token_id
    bar = None
    if progress and todo:
        from tqdm import tqdm

        bar = tqdm(total=len(todo), desc="target answers", unit="prompt", dynamic_ncols=True)
    for b in range(0, len(todo), batch_size):
        batch = todo[b:b + batch_size]
        with _seeded(model, seed + b if temperature > 0 else None):
            answers = generate_responses_in_memory(model, [prompts[i] for i in batch],
                                                   max_new_tokens, temperature, pad_id,
                                                   tokenizer.eos_token_id)
        for i, new in zip(batch, answers):
            done[keys[i]] = new
            append_jsonl(path, {"key": keys[i], "response_ids": new})
        if bar is not None:
            bar.update(len(batch))
    if bar is not None:
        bar.close()
    return [done[k] for k in keys]


@contextlib.contextmanager
def _seeded(model: Any, seed: int | None) -> Iterator[None]:
    """Sample under ``seed`` and leave the caller's RNG as it was: sampled answers depend on
    the seed only, and a run that generates them trains exactly like one that reads them from
    the cache."""
    if seed is None:
        yield
        return
    import torch

    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


def generate_responses_in_memory(model: Any, prompts: list[list[int]], max_new_tokens: int,
                                 temperature: float, pad_id: int, eos_id: int
                                 ) -> list[list[int]]:
    """One batched ``generate`` call with left padding; response ids up to and incl. EOS."""
    import torch

    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(prompts), width), dtype=torch.long)
    for j, p in enumerate(prompts):  # left padding: every prompt ends where generation starts
        ids[j, width - len(p):] = torch.tensor(p)
        attn[j, width - len(p):] = 1
    kwargs: dict = {"do_sample": False}
    if temperature > 0:
        kwargs = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    with torch.no_grad():
        out = model.generate(input_ids=ids.to(device), attention_mask=attn.to(device),
                             max_new_tokens=max_new_tokens, pad_token_id=pad_id,
                             eos_token_id=eos_id, **kwargs)
    answers = []
    for j in range(len(prompts)):
        new = out[j, width:].tolist()
        if eos_id in new:
            new = new[:new.index(eos_id) + 1]
        answers.append(new)
    return answers
