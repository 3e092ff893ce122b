"""The target's answers from vLLM (``data.generate.engine: vllm``): the same greedy tokens as
draftkit's own engine, stop tokens kept, from one replica or two (two engine processes
answering their shares: the data-parallel topology in miniature), cached and resumed as
draftkit's answers are."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from draftkit.cli import main
from draftkit.data.generate import (VllmAnswers, answer_stop_ids, engine_answers,
                                    generate_responses, read_cache)
from draftkit.models import load_model, load_tokenizer
from tests.helpers import ROW_WORDS, engine_llama, make_tokenizer, save_model, tiny_recipe

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    tok = make_tokenizer()
    return save_model(engine_llama(len(tok), 4, seed=3), tok,
                      tmp_path_factory.mktemp("target") / "target")


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    tok = make_tokenizer()
    return [tok.encode(" ".join(rng.sample(ROW_WORDS, rng.randint(2, 6)))) for _ in range(n)]


def test_greedy_answers_are_draftkits_tokens_from_two_replicas(vllm_worker, target_dir,
                                                                     tmp_path):
    model = load_model(str(target_dir), device="cpu", dtype="float32")
    stop = answer_stop_ids(model, load_tokenizer(str(target_dir)))
    prompts = _prompts(12)
    seeds = list(range(12))
    # a random model seldom emits its end token: stop at a token it does emit too
    first = dict(engine_answers(model, prompts, 16, 0.0, stop, seeds, 4))
    common = Counter(t for a in first.values() for t in a[2:]).most_common(1)[0][0]
    stop = sorted({*stop, common})
    ours = dict(engine_answers(model, prompts, 16, 0.0, stop, seeds, 4))
    assert any(a and a[-1] in stop for a in ours.values()), "no answer stopped: a weak test"
    # two engine processes answering their shares: the session's and one more
    from draftkit.engines.vllm import VllmWorker

    with VllmWorker(threads=1) as second:
        engine = VllmAnswers(target_dir, "float32", workers=[vllm_worker, second])
        theirs = dict(engine.answers(prompts, 16, 0.0, stop, seeds, 4))
    assert theirs == ours, vllm_worker.info.label


def test_answers_are_cached_and_read_back_without_the_engine(vllm_worker, target_dir, tmp_path):
    model = load_model(str(target_dir), device="cpu", dtype="float32")
    tok = load_tokenizer(str(target_dir))
    prompts, path = _prompts(6, seed=1), tmp_path / "answers.jsonl"
    engine = VllmAnswers(target_dir, "float32", workers=[vllm_worker])
    first = generate_responses(model, tok, prompts, path, 12, 4, progress=False, engine=engine)
    assert len(read_cache(path)) == 6
    # every answer is cached: a second run needs no engine at all
    gone = VllmAnswers(target_dir, "float32", python=str(tmp_path / "no-python"))
    assert generate_responses(model, tok, prompts, path, 12, 4, progress=False,
                              engine=gone) == first
    # a prompt not yet answered does need it, and says so in one line
    from draftkit.engines.vllm import EngineError

    with pytest.raises(EngineError, match="not a Python interpreter"):
        generate_responses(model, tok, prompts + _prompts(1, seed=9), path, 12, 4,
                           progress=False, engine=gone)


def test_a_recipe_prepares_its_target_answers_in_vllm(vllm_worker, target_dir, tmp_path,
                                                      capsys):
    """``draftkit distill RECIPE --prepare`` with data.generate.engine=vllm: its answers
    cached apart from draftkit's engine's, and the same greedy tokens."""
    recipe, _ = tiny_recipe(tmp_path, target_dir)
    caches = {}
    for engine in ("draftkit", "vllm"):
        gen = tmp_path / f"gen-{engine}"
        assert main(["distill", str(recipe), "--prepare", f"out_dir={tmp_path / engine}",
                     f"data.generate.cache_dir={gen}", f"data.generate.engine={engine}"]) == 0
        (cache,) = gen.glob("responses-*.jsonl")
        caches[engine] = cache
    read = {e: {json.loads(line)["key"]: json.loads(line)["response_ids"]
                for line in p.read_text().splitlines()} for e, p in caches.items()}
    assert caches["vllm"].name != caches["draftkit"].name  # keyed by the engine too
    assert read["vllm"] == read["draftkit"] and len(read["vllm"]) >= 8


def test_engine_keys_are_refused_without_the_engine(tmp_path, target_dir):
    recipe, _ = tiny_recipe(tmp_path, target_dir)
    assert main(["distill", str(recipe), "--dry-run", "data.generate.replicas=2"]) == 2
