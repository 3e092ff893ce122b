"""The target's own responses to domain prompts, generated once and cached on disk.

DistillSpec (arXiv 2310.08461) finds target-generated data better than fixed text: the draft
learns the distribution it will be asked to match when serving. The target answers on
draftkit's own decoding engine (static KV cache, the Llama-family fast path, a finished row's
slot refilled at once: continuous batching, as the server decodes), which gives HF
``generate``'s greedy answers in less time (the embedded target, 8 prompts of 48 tokens on one
thread: 4.3-4.7 s against 7.0-7.5 s, the same tokens). Every finished answer is appended to a
JSONL cache, so a killed run resumes where it stopped and a second run with the same target and
settings reuses it. A sampled answer is drawn from a generator of its own, seeded with the seed
and its prompt alone, so a resumed run gets the answers an uninterrupted one would. A draft's
answers for on-policy data, over its reduced head, come from the same engine
(:func:`answers_in_memory`).

Where one process is too slow (a 70B target, half a million prompts), the answers come from vLLM
instead (:class:`VllmAnswers`, recipe key ``data.generate.engine: vllm``): one or more engine
processes (data-parallel replicas, each sharded over ``tensor_parallel_size`` devices), each
batching its share of the prompts, every finished batch appended to the same kind of cache.
Their greedy answers are draftkit's tokens (tested); the cache is keyed by the engine too, so
neither engine's answers are read as the other's.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import torch
from tqdm import tqdm

from draftkit.decode.engine import SpeculativeEngine
from draftkit.decode.sampling_params import SamplingParams
from draftkit.decode.state import round_margin
from draftkit.engines.vllm import VllmWorker
from draftkit.io import append_jsonl, cut_torn_tail, one_builder
from draftkit.models.facts import stop_token_ids
from draftkit.models.reduced_head import attach, head_of

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


def prompt_seed(seed: int, key: str) -> int:
    """The seed of one prompt's sampled answer: the run's seed and the prompt, nothing else (not
    the batch it falls in, nor which prompts a killed run had already answered)."""
    return int(hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()[:15], 16)


def generate_responses(model: Any, tokenizer: Any, prompts: list[list[int]], path: Path,
                       max_new_tokens: int, batch_size: int, temperature: float = 0.0,
                       seed: int = 0, progress: bool = True,
                       stop_ids: list[int] | None = None,
                       engine: VllmAnswers | None = None) -> list[list[int]]:
    """Response ids for each prompt (ids up to and including the first of ``stop_ids``,
    default :func:`answer_stop_ids`), from the cache or generated (by draftkit's engine, or
    by ``engine``).

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
            bar = tqdm(total=len(todo), desc="target answers", unit="prompt",
                       dynamic_ncols=True)
        seeds = [prompt_seed(seed, keys[i]) for i in todo]
        answer = engine.answers if engine is not None else \
            (lambda *a: engine_answers(model, *a))
        for j, new in answer([prompts[i] for i in todo], max_new_tokens, temperature, stop_ids,
                             seeds, batch_size):
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
    if not prompts:
        return
    engine = SpeculativeEngine(model, eos_token_id=stop_ids)
    params = SamplingParams(temperature, 0, 1.0)
    max_len = max(map(len, prompts)) + max_new_tokens + round_margin(0)
    if engine.context:
        max_len = min(max_len, engine.context)
    batch = engine.open(min(slots, len(prompts)), max_len=max_len)
    queue, seated = list(range(len(prompts))), {}  # seated: slot -> prompt index
    while queue or seated:
        if queue and (free := batch.free_slots()):
            chosen, queue = queue[:free], queue[free:]
            admitted = batch.admit([prompts[i] for i in chosen], params, max_new_tokens,
                                   [seeds[i] for i in chosen])
            seated.update(zip(admitted, chosen))
        if batch.live:
            batch.step()
        for slot in [b for b in seated if batch.output(b).done]:
            yield seated.pop(slot), batch.output(slot).tokens
            batch.release(slot)


class VllmAnswers:
    """The target's answers from vLLM (:mod:`draftkit.engines.vllm`): ``replicas`` engine
    processes, each loading the target (``tensor_parallel_size`` ranks) and answering batches of
    prompts as they come free, so a killed run loses at most the batches in flight.

    Each prompt is one request sampled with its own seed (vLLM's per-request seed: a sampled
    answer depends on its seed alone, not on the batch); it stops at the first of the stop ids,
    which it keeps, and nowhere else (vLLM's own end-of-sequence rule is off: the stop ids
    already hold it)."""

    def __init__(self, target_dir: str | Path, dtype: str, tensor_parallel_size: int = 1,
                 replicas: int = 1, python: str | None = None, workers: list | None = None):
        """``workers``: running :class:`~draftkit.engines.vllm.VllmWorker` s to answer in, one
        a replica (left running at the end); else ``replicas`` are started under
        ``python``."""
        self.target_dir, self.dtype = str(target_dir), dtype
        self.tp, self.python, self.workers = tensor_parallel_size, python, workers
        self.replicas = len(workers) if workers else replicas

    def cache_tag(self) -> str:
        """Beside the target's identity in the cache key: these answers are the engine's."""
        return "vllm"

    def answers(self, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                stop_ids: list[int], seeds: list[int], batch: int
                ) -> Iterator[tuple[int, list[int]]]:
        """(index, answer ids up to and including the first stop id) as batches finish."""
        if not prompts:
            return
        threads = max(1, (os.cpu_count() or 1) // self.replicas)
        context = max(map(len, prompts)) + max_new_tokens + 8
        chunks = [list(range(i, min(i + batch, len(prompts))))
                  for i in range(0, len(prompts), batch)]
        todo: queue.Queue = queue.Queue()
        for chunk in chunks:
            todo.put(chunk)
        done: queue.Queue = queue.Queue()
        stops = set(stop_ids)

        def replica(worker) -> None:
            try:
                worker.call("load", name="target", model=self.target_dir, dtype=self.dtype,
                            max_model_len=context, max_num_seqs=batch,
                            tensor_parallel_size=self.tp)
                while True:
                    try:
                        chunk = todo.get_nowait()
                    except queue.Empty:
                        return
                    out = worker.call(
                        "generate", name="target", prompts=[prompts[i] for i in chunk],
                        seeds=[seeds[i] for i in chunk], each=False,
                        sampling={"temperature": temperature, "max_tokens": max_new_tokens,
                                  "stop_token_ids": stop_ids, "ignore_eos": True})
                    done.put([(i, cut_at_stop(o["tokens"], stops)) for i, o in
                              zip(chunk, out["outputs"])])
            except BaseException as e:  # the main thread raises it
                done.put(e)

        workers = self.workers or [VllmWorker(self.python, threads=threads, env=env)
                                   for env in replica_devices(self.replicas, self.tp)]
        running = [threading.Thread(target=replica, args=(w,), daemon=True) for w in workers]
        try:
            for t in running:
                t.start()
            for _ in chunks:
                item = done.get()
                if isinstance(item, BaseException):
                    raise item
                yield from item
        finally:
            for w, t in zip(workers, running):
                if not self.workers:
                    w.close()
                elif not t.is_alive():  # the caller's: left running, the target unloaded
                    w.call("unload", name="target")


def replica_devices(replicas: int, tp: int) -> list[dict[str, str]]:
    """Each replica's own ``tp`` GPUs (CUDA_VISIBLE_DEVICES), where there are enough for all;
    else nothing set (a CPU, or one GPU the replicas share)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = [d for d in visible.split(",") if d.strip()] if visible is not None else \
        [str(i) for i in range(torch.cuda.device_count())]
    if len(devices) < replicas * tp or replicas * tp == 1:
        return [{} for _ in range(replicas)]
    return [{"CUDA_VISIBLE_DEVICES": ",".join(devices[r * tp:(r + 1) * tp])}
            for r in range(replicas)]


def cut_at_stop(tokens: list[int], stops: set[int]) -> list[int]:
    """``tokens`` up to and including the first of ``stops`` (all of them where none is)."""
    end = next((i for i, t in enumerate(tokens) if t in stops), None)
    return tokens if end is None else tokens[:end + 1]


def answers_in_memory(model: Any, prompts: list[list[int]], max_new_tokens: int,
                      temperature: float, stop_ids: list[int], seeds: list[int] | None,
                      head: "ReducedHead | None" = None) -> list[list[int]]:
    """Each prompt's answer ids up to and including the first of ``stop_ids``, in prompt order,
    decoded by :func:`engine_answers` with every prompt in one batch: a draft's answers for an
    on-policy step. ``head``: a draft's reduced head (draftkit/models/reduced_head.py), the only
    tokens it may then emit, as when it is served.

    Greedy at ``temperature`` 0; otherwise each answer is drawn from a generator of its own
    seed (one of ``seeds`` a prompt) and depends on it alone, not on the global RNG: a resumed
    run, or another process, draws the same answers."""
    if temperature > 0 and (seeds is None or len(seeds) != len(prompts)):
        raise ValueError("sampled answers need one seed a prompt")
    seeds = seeds if seeds is not None else [0] * len(prompts)
    served = head_of(model)
    attach(model, head if head is not None else served)  # the runner decodes over it
    try:
        out = dict(engine_answers(model, prompts, max_new_tokens, temperature, stop_ids, seeds,
                                  len(prompts)))
    finally:
        attach(model, served)
    return [out[i] for i in range(len(prompts))]
