"""The target's own responses to domain prompts, generated once and cached on disk.

DistillSpec (arXiv 2310.08461) finds target-generated data better than fixed text: the draft
learns the distribution it will be asked to match when serving. The target answers on
draftkit's own decoding engine (static KV cache, the Llama-family fast path, a finished row's
slot refilled at once: continuous batching, as the server decodes), which gives HF
``generate``'s greedy answers in less time (the embedded target, 8 prompts of 48 tokens on one
thread: 4.3-4.7 s against 7.0-7.5 s, the same tokens). Every finished answer is appended to a
JSONL cache, so a killed run resumes where it stopped and a second run with the same target and
settings reuses it. A sampled answer is drawn from a generator of its own, seeded with the seed
and its prompt alone, so a resumed run gets the answers an uninterrupted one would. (A draft's
answers for on-policy data, over its reduced head, go through HF ``generate``:
:func:`generate_responses_in_memory`.)
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from draftkit.io import append_jsonl, one_builder
from draftkit.models.facts import stop_token_ids

if TYPE_CHECKING:
    from draftkit.models.reduced_head import ReducedHead


def prompt_key(prompt_ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest()[:20]


def cache_file(cache_dir: Path, target_id: str, max_new_tokens: int, temperature: float,
               seed: int, stop_ids: list[int]) -> Path:
    """One file per (target, settings): changing them never mixes responses. ``target_id``
    names the target's weights and dtype (a bf16 target answers otherwise than an fp32 one);
    greedy answers do not depend on the seed, so every seed shares them."""
    seed = seed if temperature > 0 else 0
    tag = hashlib.sha256(f"{target_id}|{max_new_tokens}|{float(temperature)}|{seed}|"
                         f"{sorted(stop_ids)}".encode())
    return Path(cache_dir) / f"responses-{tag.hexdigest()[:12]}.jsonl"


def answer_stop_ids(model: Any, tokenizer: Any) -> list[int]:
    """Where an answer ends: where decoding and serving stop (the target's end-of-turn
    tokens), and at the tokenizer's eos."""
    ids = set(stop_token_ids(model))
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


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


def cut_torn_tail(path: Path) -> None:
    """Drop a torn last line (a run killed mid-write): the next append would glue its answer
    onto it, and :func:`read_cache` would then skip that answer with the torn line."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return
        f.seek(0)
        f.truncate(f.read().rfind(b"\n") + 1)


def prompt_seed(seed: int, key: str) -> int:
    """The seed of one prompt's sampled answer: the run's seed and the prompt, nothing else (not
    the batch it falls in, nor which prompts a killed run had already answered)."""
    return int(hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()[:15], 16)


def generate_responses(model: Any, tokenizer: Any, prompts: list[list[int]], path: Path,
                       max_new_tokens: int, batch_size: int, temperature: float = 0.0,
                       seed: int = 0, progress: bool = True,
                       stop_ids: list[int] | None = None) -> list[list[int]]:
    """Response ids for each prompt (ids up to and including the first of ``stop_ids``,
    default :func:`answer_stop_ids`), from the cache or generated.

    prompts: lists of token ids (already rendered through the chat template). Another run
    answering into the same cache file is waited for; its answers are then read, not redone.
    """

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if stop_ids is None:
        stop_ids = answer_stop_ids(model, tokenizer)
    with one_builder(path.with_name(path.name + ".lock"), f"target answers {path}"):
        cut_torn_tail(path)
        done = read_cache(path)
        keys = [prompt_key(p) for p in prompts]
        todo = [i for i, k in enumerate(keys) if k not in done]
        # Longest first: batches of similar length waste less padding.
        todo.sort(key=lambda i: -len(prompts[i]))
        bar = None
        if progress and todo:
            from tqdm import tqdm

            bar = tqdm(total=len(todo), desc="target answers", unit="prompt",
                       dynamic_ncols=True)
        seeds = [prompt_seed(seed, keys[i]) for i in todo]
        for j, new in engine_answers(model, [prompts[i] for i in todo], max_new_tokens,
                                     temperature, stop_ids, seeds, batch_size):
            done[keys[todo[j]]] = new
            append_jsonl(path, {"key": keys[todo[j]], "response_ids": new})
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
    return [done[k] for k in keys]


def engine_answers(model: Any, prompts: list[list[int]], max_new_tokens: int,
                   temperature: float, stop_ids: list[int], seeds: list[int], slots: int
                   ) -> Iterator[tuple[int, list[int]]]:
    """(index, answer ids up to and including the first of ``stop_ids``) as each prompt's
    answer finishes, decoded plainly (K = 0) on draftkit's engine over ``slots`` rows, a
    finished row's slot refilled at once (on the general transformers path, whose cache cannot
    take one new row, a new cohort when the last one is done). Greedy at ``temperature`` 0;
    otherwise prompt i is sampled from its own generator seeded with ``seeds[i]``."""
    import torch

    from draftkit.decode.batch import round_margin
    from draftkit.decode.engine import SpeculativeEngine
    from draftkit.decode.sampling import SamplingParams

    if not prompts:
        return
    engine = SpeculativeEngine(model, eos_token_id=stop_ids)
    params = SamplingParams(temperature, 0, 1.0)
    max_len = max(map(len, prompts)) + max_new_tokens + round_margin(0)
    if engine.context:
        max_len = min(max_len, engine.context)
    slots = 1 if engine.one_row_cohorts else min(slots, len(prompts))
    state = engine.open(slots, 0, max_len)
    queue, seated = list(range(len(prompts))), {}  # seated: slot -> prompt index
    while queue or seated:
        free = state.occupied.count(False)
        if queue and free and (engine.slotted or not seated):
            batch, queue = queue[:free], queue[free:]
            gens = ([torch.Generator(engine.device).manual_seed(seeds[i]) for i in batch]
                    if temperature > 0 else None)
            admitted = engine.admit(state, [prompts[i] for i in batch], params,
                                    max_new_tokens, gens)
            seated.update(zip(admitted, batch))
        if state.live():
            engine.step(state, 0)
        for slot in [b for b in seated if state.done[b]]:
            yield seated.pop(slot), state.result(slot).tokens
            engine.release(state, slot)


class RowSampler:
    """A logits processor that turns greedy decoding into sampling at ``temperature``, each row
    drawing from a generator of its own seed (the Gumbel-max trick: the argmax of the scores
    over ``temperature`` plus Gumbel noise is a draw from their softmax).

    ``generate(do_sample=True)`` draws every row from the one global RNG, so a row's answer
    would depend on the rows batched with it; here it depends on its seed alone.
    """

    def __init__(self, seeds: list[int], temperature: float):
        self.seeds, self.temperature = seeds, temperature
        self.generators: list | None = None  # made on the device the scores are on

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if self.generators is None:
            self.generators = [torch.Generator(scores.device).manual_seed(s) for s in self.seeds]
        uniform = torch.stack([torch.rand(scores.shape[1], generator=g, device=scores.device)
                               for g in self.generators])
        # clamped away from 0 so the noise stays finite and a -inf score stays unreachable
        uniform = uniform.clamp_min(torch.finfo(uniform.dtype).tiny)
        return scores / self.temperature - torch.log(-torch.log(uniform))


def generate_responses_in_memory(model: Any, prompts: list[list[int]], max_new_tokens: int,
                                 temperature: float, pad_id: int, stop_ids: list[int],
                                 seeds: list[int] | None, head: "ReducedHead | None" = None
                                 ) -> list[list[int]]:
    """One batched ``generate`` call with left padding; response ids up to and including the
    first of ``stop_ids`` (:func:`answer_stop_ids`). ``head``: a draft's reduced head
    (draftkit/models/reduced_head.py), the only tokens it may then emit.

    Greedy at ``temperature`` 0; otherwise each answer is drawn from its own one of ``seeds``
    (one a prompt) and depends on it alone, not on the global RNG: a resumed run, or another
    process, draws the same answers.
    """
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
        if seeds is None or len(seeds) != len(prompts):
            raise ValueError("sampled answers need one seed a prompt")
        kwargs["logits_processor"] = [RowSampler(seeds, temperature)]
    if head is not None:  # masks the scores outside H before RowSampler draws from them
        allowed = head.ids.tolist()
        kwargs["prefix_allowed_tokens_fn"] = lambda batch_id, sent: allowed
    with torch.no_grad():
        out = model.generate(input_ids=ids.to(device), attention_mask=attn.to(device),
                             max_new_tokens=max_new_tokens, pad_token_id=pad_id,
                             eos_token_id=list(stop_ids), **kwargs)
    stops = set(stop_ids)
    answers = []
    for j in range(len(prompts)):
        new = out[j, width:].tolist()
        end = next((i for i, t in enumerate(new) if t in stops), None)
        answers.append(new if end is None else new[:end + 1])
    return answers
