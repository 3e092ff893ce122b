"""Parallel EAGLE-3 heads (P-EAGLE, arXiv 2602.01469) in bundles: the head in the layout vLLM
loads (``mask_hidden``, ``ptd_token_id``), vLLM told ``parallel_drafting`` from the first
release that has it, SGLang (which has no parallel drafting) refused in one line, and
``draftkit check`` accepting the bundle and naming what disagrees in a broken one."""

import json
import subprocess

import pytest
import torch
from safetensors.torch import load_file

from draftkit.cli import main
from draftkit.errors import ModelError
from draftkit.export import check_bundle, export_bundle
from draftkit.engines.releases import MIN_VERSIONS
from draftkit.models.eagle3 import load_eagle3
from tests.helpers import fake_engines, parallel_head, write_manifest


@pytest.fixture
def saved(tmp_path):
    return parallel_head(tmp_path)


def _launched(script, env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)


def test_export_tells_vllm_and_refuses_sglang_in_one_line(saved, tmp_path, capsys):
    target, target_dir, head_dir = saved
    capsys.readouterr()
    assert main(["export", "--target", str(target_dir), "--draft", str(head_dir), "--out",
                 str(tmp_path / "bundle"), "--k", "4"]) == 0
    said = capsys.readouterr()
    refused = [line for line in said.err.splitlines() if "SGLang" in line]
    assert len(refused) == 1 and "SGLang has no parallel drafting" in refused[0] and \
        refused[0].endswith("its serving script will refuse to start")
    assert "SGLang: will not serve this draft: its script refuses to start" in said.out
    out, h, v = tmp_path / "bundle", target.config.hidden_size, target.config.vocab_size

    config = json.loads((out / "draft" / "config.json").read_text())
    assert config["parallel_drafting"] is True and config["ptd_token_id"] == v - 1
    state = load_file(str(out / "draft" / "model.safetensors"))
    assert tuple(state["mask_hidden"].shape) == (1, 3 * h)  # as vLLM's llama_eagle3 loads it
    head, exported = load_eagle3(head_dir, target), load_eagle3(out / "draft", target)
    assert exported.parallel
    torch.testing.assert_close(exported.mask_hidden, head.mask_hidden.bfloat16().float())

    draft = str((out / "draft").resolve())
    spec = {"method": "eagle3", "model": draft, "num_speculative_tokens": 4,
            "draft_sample_method": "probabilistic", "parallel_drafting": True}
    assert json.loads((out / "serving" / "vllm.json").read_text()) == spec
    manifest = check_bundle(out)
    vllm, sglang = manifest.serving.engines.vllm, manifest.serving.engines.sglang
    assert vllm.parallel_drafting is True
    assert vllm.min_version == MIN_VERSIONS["vllm", "parallel"][0] == "0.16.0"
    assert "#23171" in sglang.refused
    readme = (out / "serving" / "README.md").read_text()
    assert "parallel EAGLE-3 head (P-EAGLE, arXiv 2602.01469)" in readme
    assert "**SGLang will not serve this draft**: SGLang has no parallel drafting" in readme
    assert "| vllm >= 0.16.0 (the first with parallel_drafting" in readme
    assert "[flags]` | will not serve this draft (below) |" in readme  # SGLang's row
    assert "| SGLang >=" not in readme  # no figure is said to hold where it will not serve

    said = _launched(out / "serving" / "vllm.sh", fake_engines(tmp_path)).stdout.splitlines()
    assert json.loads(said[said.index("--speculative-config") + 1]) == spec
    older = _launched(out / "serving" / "vllm.sh", fake_engines(tmp_path, vllm="0.15.1"))
    assert older.returncode == 1 and "older than this bundle needs (0.16.0: the first with " \
                                     "parallel_drafting" in older.stderr
    sglang_sh = _launched(out / "serving" / "sglang.sh", fake_engines(tmp_path))
    assert sglang_sh.returncode == 1 and sglang_sh.stdout == ""
    assert "SGLang has no parallel drafting" in sglang_sh.stderr
    # the way out it names serves an EAGLE-3 head: HF's assisted generation does not
    assert sglang_sh.stderr.strip().endswith("serve this bundle with the other engine or "
                                             "`draftkit serve`")

    capsys.readouterr()
    assert main(["check", str(out)]) == 0
    assert "parallel EAGLE-3 head tapping target layers [2, 4, 5], K=4" in capsys.readouterr().out


def test_an_autoregressive_heads_bundle_says_nothing_of_parallel_drafting(tmp_path):
    """The keys are the parallel head's alone: an EAGLE-3 head's bundle is written as before."""
    from draftkit.models.eagle3 import from_target
    from tests.helpers import save_head

    target, target_dir, head_dir = parallel_head(tmp_path)
    ar = from_target(target, load_eagle3(head_dir, target).reduced_head)
    out = export_bundle(str(target_dir), str(save_head(ar, tmp_path / "ar", target_dir)),
                        tmp_path / "bundle", k=3)
    assert "parallel_drafting" not in (out / "serving" / "vllm.json").read_text()
    manifest = json.loads((out / "draftkit.json").read_text())
    assert "parallel_drafting" not in manifest["serving"]["engines"]["vllm"]
    assert manifest["serving"]["engines"]["sglang"]["refused"] is None


def _edit(out, config=None, spec=None, manifest=None, drop=None):
    """The bundle at ``out`` with draft/config.json, serving/vllm.json or the manifest's vLLM
    entry updated (a None value removes the key) or a tensor dropped, and re-sealed, so only
    the layout and consistency checks are left to catch it."""
    from safetensors.torch import save_file

    from draftkit.io import sha256_file

    for path, changes in ((out / "draft" / "config.json", config),
                          (out / "serving" / "vllm.json", spec)):
        data = {**json.loads(path.read_text()), **(changes or {})}
        path.write_text(json.dumps({k: v for k, v in data.items() if v is not None}))
    if drop:
        weights = out / "draft" / "model.safetensors"
        state = load_file(str(weights))
        save_file({k: v for k, v in state.items() if k != drop}, str(weights),
                  metadata={"format": "pt"})
    data = json.loads((out / "draftkit.json").read_text())
    data["serving"]["engines"]["vllm"].update(manifest or {})
    data["files"] = {rel: sha256_file(out / rel) for rel in data["files"]}
    write_manifest(out, data)


BROKEN = [  # (edit, what check says)
    ({"spec": {"parallel_drafting": None}},
     "serving/vllm.json says parallel_drafting None but draftkit.json's serving entry makes it "
     "True"),
    ({"manifest": {"parallel_drafting": None}, "spec": {"parallel_drafting": None}},
     "serving.engines.vllm.parallel_drafting is None but draft/config.json parallel_drafting "
     "is True"),
    ({"config": {"ptd_token_id": 10_000}}, "a parallel head's ptd_token_id is 10000"),
    ({"config": {"ptd_token_id": None}}, "ptd_token_id is None"),
    ({"config": {"pard_token": 5}}, "pard_token is 5, not the ptd_token_id 137: vLLM reads it "
                                    "first"),
    ({"drop": "mask_hidden"}, "lacks mask_hidden, the placeholder a parallel head's positions "
                              "2..K read: vLLM refuses the head"),
    ({"config": {"parallel_drafting": None}}, "holds mask_hidden, a name"),
]


@pytest.mark.parametrize("edit,message", BROKEN)
def test_check_names_what_a_broken_parallel_bundle_disagrees_on(saved, tmp_path, edit, message):
    _, target_dir, head_dir = saved
    out = export_bundle(str(target_dir), str(head_dir), tmp_path / "bundle", k=3)
    _edit(out, **edit)
    with pytest.raises(ModelError, match=message):
        check_bundle(out)


def test_validate_configs_reads_vllms_and_skips_the_refused_sglang(saved, tmp_path):
    """serve/validate_configs.py (with the stand-in vLLM its own tests use): vLLM resolves
    parallel_drafting as written; SGLang, which the bundle refuses, is one line saying why."""
    from tests.serve.test_validate_configs import fake_vllm, run

    _, target_dir, head_dir = saved
    out = export_bundle(str(target_dir), str(head_dir), tmp_path / "bundle", k=3)
    r = run(out, fake_vllm(tmp_path / "fake"))
    assert r.returncode == 0, r.stdout + r.stderr
    ok = [line for line in r.stdout.splitlines() if ": ok: " in line]
    assert len(ok) == 2 and all("parallel_drafting=True" in line for line in ok)
    assert r.stdout.splitlines()[-1].startswith(
        "skipped SGLang: the bundle's sglang.sh refuses to start: SGLang has no parallel "
        "drafting")
