import json
from pathlib import Path

import pytest
import torch

from draftkit.errors import DraftkitError, ModelError
from draftkit.export import check_bundle, export_bundle
from tests.helpers import fake_engines, make_llama, make_tokenizer, save_model


def test_export_check_and_hf_assisted_generation(tiny_dirs, tmp_path):
    target_dir, draft_dir = tiny_dirs
    report = tmp_path / "report.json"
    report.write_text(json.dumps({
        "overall": {"k": 4}, "device": "cpu", "dtype": "float32",
        "domains": {"code": {"alpha": 0.6, "tau": 2.1, "c": 0.2, "k": 4, "verdict": "speculate"}},
        "break_even": {"kind": "crosses", "x": 7.2, "batch_size": 8}}))
    out = export_bundle(str(target_dir), str(draft_dir), tmp_path / "bundle", report=report)
    manifest = check_bundle(out)
    assert manifest.num_speculative_tokens == 4 and manifest.k_source == "report"
    assert manifest.draft.kind == "standalone"
    assert manifest.domains["code"].alpha == 0.6 and manifest.break_even_batch == 8
    assert manifest.break_even_kind == "crosses"
    assert manifest.target.path == str(target_dir.resolve())
    assert len(manifest.target.sha256) == 64
    assert {"draft/model.safetensors", "draft/config.json", "draft/tokenizer.json",
            "draft/generation_config.json", "serving/vllm.json"} <= set(manifest.files)
    gen = json.loads((out / "draft" / "generation_config.json").read_text())
    assert gen["num_assistant_tokens"] == 4 and gen["num_assistant_tokens_schedule"] == "constant"
    assert gen["assistant_confidence_threshold"] == 0.0
    vllm = json.loads((out / "serving" / "vllm.json").read_text())
    assert vllm == {"method": "draft_model", "model": str((out / "draft").resolve()),
                    "num_speculative_tokens": 4, "draft_sample_method": "probabilistic"}
    assert "--speculative-num-draft-tokens 5" in (out / "serving" / "sglang.sh").read_text()
    card = (out / "draft" / "README.md").read_text()  # the model card, hashed with the rest
    assert card.startswith("---\nbase_model: ") and "draft/README.md" in manifest.files
    assert "**K (num_speculative_tokens):** 4 (the K the eval's decodes used most)" in card
    assert "| code | " in card and "| 0.600 | 2.10 |" in card
    assert "Trained on:** not recorded" in card

    # HF assisted generation with the bundle's draft equals the target's greedy output.
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    draft = AutoModelForCausalLM.from_pretrained(out / "draft").eval()
    ids = torch.tensor([[1, 40, 41, 42, 43]])
    plain = target.generate(ids, max_new_tokens=20, do_sample=False)
    assisted = target.generate(ids, max_new_tokens=20, do_sample=False, assistant_model=draft)
    assert torch.equal(plain, assisted)


@pytest.mark.parametrize("name", ["eval.json", "eval_k0.json"])
def test_export_reads_a_report_written_before_reports_were_typed(tiny_dirs, tmp_path, name):
    """A report.json of an earlier draftkit (tests/evaluate/reports): the bundle records its
    figures and recommends its K as export always did, read key by key from the JSON here."""
    target_dir, draft_dir = tiny_dirs
    path = Path(__file__).parents[1] / "evaluate" / "reports" / name
    raw = json.loads(path.read_text())
    manifest = check_bundle(export_bundle(str(target_dir), str(draft_dir), tmp_path / "b",
                                          report=path)).to_dict()
    assert manifest["num_speculative_tokens"] == raw["overall"]["k"]
    assert manifest["k_source"] == "report" and manifest["measured"] is True
    keys = ("alpha", "tau", "c", "k", "speedup_measured", "speedup_predicted", "verdict")
    assert manifest["domains"] == {domain: {key: row[key] for key in keys}
                                   for domain, row in raw["domains"].items()}
    assert manifest["break_even_batch"] == raw["break_even"]["batch_size"]
    assert manifest["break_even_kind"] == raw["break_even"]["kind"]
    assert manifest["report"] == {key: raw[key] for key in ("device", "dtype", "temperature",
                                                            "created")}


def test_an_empty_or_foreign_report(tiny_dirs, tmp_path):
    target_dir, draft_dir = tiny_dirs
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    manifest = check_bundle(export_bundle(str(target_dir), str(draft_dir), tmp_path / "b",
                                          report=empty))
    assert manifest.k_source == "default" and manifest.measured is False
    foreign = tmp_path / "foreign.json"
    foreign.write_text("[1, 2]")
    with pytest.raises(DraftkitError, match="is not a draftkit eval report.json"):
        export_bundle(str(target_dir), str(draft_dir), tmp_path / "c", report=foreign)


def test_check_names_tampered_and_truncated_files(tiny_dirs, tmp_path):
    target_dir, draft_dir = tiny_dirs
    out = export_bundle(str(target_dir), str(draft_dir), tmp_path / "b", k=2)
    cfg = out / "draft" / "config.json"
    cfg.write_text(cfg.read_text().replace('"num_hidden_layers": 1', '"num_hidden_layers": 2'))
    with pytest.raises(ModelError, match=r"draft/config.json does not match its sha256"):
        check_bundle(out)
    out2 = export_bundle(str(target_dir), str(draft_dir), tmp_path / "b2", k=2)
    weights = out2 / "draft" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ModelError, match=r"draft/model.safetensors does not match"):
        check_bundle(out2)
    (out2 / "draft" / "model.safetensors").unlink()
    with pytest.raises(ModelError, match=r"draft/model.safetensors is missing"):
        check_bundle(out2)


def test_an_edited_manifest_is_refused_by_check_and_by_every_command_loading_the_bundle(
        tiny_dirs, tmp_path, capsys):
    """The manifest hashes itself: an edit in any field is caught, out-of-range values by their
    field, any other by the hash; removing the hash does not get past it."""
    from draftkit.cli import main
    from draftkit.models.resolve import resolve_model

    target_dir, draft_dir = tiny_dirs
    report = tmp_path / "report.json"
    report.write_text(json.dumps({
        "overall": {"k": 2}, "domains": {"code": {"alpha": 0.5, "tau": 1.8, "c": 0.2, "k": 2}}}))
    out = export_bundle(str(target_dir), str(draft_dir), tmp_path / "b", report=report)
    sealed = (out / "draftkit.json").read_text()
    assert '"manifest_sha256"' in sealed and check_bundle(out).num_speculative_tokens == 2

    def edited(edit) -> None:
        manifest = json.loads(sealed)
        edit(manifest)
        (out / "draftkit.json").write_text(json.dumps(manifest, indent=2))

    cases = [  # (edit, what the one line names)
        (lambda m: m.update(num_speculative_tokens=-7), r"num_speculative_tokens is -7"),
        (lambda m: m["domains"]["code"].update(alpha=1.4), r"domains.code.alpha is 1.4"),
        (lambda m: m["domains"]["code"].update(tau=0.5), r"domains.code.tau is 0.5"),
        (lambda m: m.update(break_even_batch=0), r"break_even_batch is 0"),
        (lambda m: m.update(num_speculative_tokens=5), r"edited after export"),
        (lambda m: m["domains"]["code"].update(speedup_measured=3.0), r"edited after export"),
        (lambda m: m["target"].update(name="someone-else"), r"edited after export"),
        (lambda m: m.pop("manifest_sha256"), r"has no manifest_sha256"),
    ]
    for edit, named in cases:
        edited(edit)
        with pytest.raises(ModelError, match=named):
            check_bundle(out)
        with pytest.raises(ModelError, match=named):
            resolve_model(str(out), "draft")  # generate, eval, serve, export load through here
        capsys.readouterr()
        assert main(["check", str(out)]) == 3  # a bundle that fails a check: a valid "no"
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    (out / "draftkit.json").write_text(sealed)  # the file as exported checks again
    assert check_bundle(out).num_speculative_tokens == 2


def test_export_refuses_bad_drafts_and_existing_dir(tiny_dirs, tmp_path):
    target_dir, draft_dir = tiny_dirs
    out = export_bundle(str(target_dir), str(draft_dir), tmp_path / "b", k=2)
    with pytest.raises(DraftkitError, match="already exists.*--force"):
        export_bundle(str(target_dir), str(draft_dir), out, k=2)
    assert export_bundle(str(target_dir), str(draft_dir), out, k=3, force=True) == out
    assert json.loads((out / "draftkit.json").read_text())["num_speculative_tokens"] == 3

    tok = make_tokenizer()
    short = make_llama(len(tok), num_layers=1)
    short.config.max_position_embeddings = 64
    short_dir = save_model(short, tok, tmp_path / "short")
    with pytest.raises(ModelError, match="max_position_embeddings 64 is below the target's 256"):
        export_bundle(str(target_dir), str(short_dir), tmp_path / "x", k=2)
    assert not (tmp_path / "x").exists()

    other = make_tokenizer(extra_words=("zebra",))
    mismatched = save_model(make_llama(len(other), num_layers=1), other, tmp_path / "mm")
    with pytest.raises(ModelError, match="vocab_size"):
        export_bundle(str(target_dir), str(mismatched), tmp_path / "y", k=2)


def test_lora_draft_is_merged(tiny_dirs, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    target_dir, draft_dir = tiny_dirs
    base = AutoModelForCausalLM.from_pretrained(draft_dir)
    lora = get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", r=4,
                                           target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # a non-trivial adapter, so merging changes the logits
    ids = torch.tensor([[1, 40, 41, 42]])
    with torch.no_grad():
        expected = lora(ids).logits
    adapter_dir = tmp_path / "adapter"
    lora.save_pretrained(adapter_dir)
    make_tokenizer().save_pretrained(adapter_dir)
    out = export_bundle(str(target_dir), str(adapter_dir), tmp_path / "b", k=2,
                        dtype="float32")  # stored as computed: the logits compare at 1e-4
    manifest = check_bundle(out)
    assert manifest.draft.lora_merged is True
    assert not (out / "draft" / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(out / "draft")
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, expected, rtol=1e-4, atol=1e-4)


def test_k_zero_recommendation_is_said_in_serving_files(tiny_dirs, tmp_path):
    target_dir, draft_dir = tiny_dirs
    out = export_bundle(str(target_dir), str(draft_dir), tmp_path / "b", k=0)
    manifest = check_bundle(out)
    assert manifest.num_speculative_tokens == 0
    assert json.loads((out / "serving" / "vllm.json").read_text())["num_speculative_tokens"] == 1
    assert "recommends K = 0" in (out / "serving" / "vllm.sh").read_text()
    assert "recommends K = 0" in (out / "serving" / "sglang.sh").read_text()


def test_force_replaces_only_a_bundle_and_files_are_readable_by_others(tiny_dirs, tmp_path):
    import os

    target_dir, draft_dir = tiny_dirs
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("keep")
    with pytest.raises(DraftkitError, match="is not a draftkit bundle .* --force will not "
                                            "replace it"):
        export_bundle(str(target_dir), str(draft_dir), mine, k=2, force=True)
    assert (mine / "keep.txt").read_text() == "keep"
    (tmp_path / "empty").mkdir()
    old = os.umask(0o022)
    try:
        out = export_bundle(str(target_dir), str(draft_dir), tmp_path / "empty", k=2,
                            force=True)
    finally:
        os.umask(old)
    # as mkdir and open make them: a vLLM or SGLang process of another user can read them
    assert out.stat().st_mode & 0o777 == 0o755
    assert (out / "draftkit.json").stat().st_mode & 0o777 == 0o644


def test_check_takes_the_target_from_the_command_line(tiny_dirs, tmp_path):
    import shutil

    target_dir, draft_dir = tiny_dirs
    moved = tmp_path / "target-here"
    shutil.copytree(target_dir, moved)
    out = export_bundle(str(moved), str(draft_dir), tmp_path / "b", k=2)
    shutil.rmtree(moved)  # the bundle travelled; its target lives elsewhere on this machine
    with pytest.raises(ModelError, match="cannot be found here; pass the target with --target"):
        check_bundle(out)
    assert check_bundle(out, target=str(target_dir)).num_speculative_tokens == 2
    (out / "draftkit.json").write_text("[]")
    with pytest.raises(ModelError, match="bundle manifest .*draftkit.json is not a JSON object"):
        check_bundle(out)
    (out / "draftkit.json").write_text("{}")
    with pytest.raises(ModelError, match="draftkit.json: target is None, not a mapping"):
        check_bundle(out)


def test_a_moved_bundle_still_serves_from_its_scripts(tiny_dirs, tmp_path, capsys):
    """The serving scripts find the draft next to themselves; check says vllm.json is stale."""
    import shutil
    import subprocess

    from draftkit.export.args import CheckArgs
    from draftkit.export.command import check

    target_dir, draft_dir = tiny_dirs
    out = export_bundle(str(target_dir), str(draft_dir), tmp_path / "bundle", k=2)
    moved = tmp_path / "elsewhere" / "bundle"
    moved.parent.mkdir()
    shutil.move(out, moved)
    check(CheckArgs(bundle=str(moved)))
    assert f"now at {moved.resolve() / 'draft'}" in capsys.readouterr().out
    env = fake_engines(tmp_path)  # stand-ins for the engines: they print what they were given
    said = subprocess.run(["bash", str(moved / "serving" / "vllm.sh"), "--port", "9"], env=env,
                          capture_output=True, text=True, check=True).stdout.splitlines()
    assert said[:2] == ["serve", str(target_dir.resolve())] and said[-2:] == ["--port", "9"]
    assert json.loads(said[3]) == {"method": "draft_model", "num_speculative_tokens": 2,
                                   "model": str(moved.resolve() / "draft"),
                                   "draft_sample_method": "probabilistic"}
    assert said[4:6] == ["--dtype", "bfloat16"]  # the dtype the draft is stored in
    said = subprocess.run(["bash", str(moved / "serving" / "sglang.sh")], env=env,
                          capture_output=True, text=True, check=True).stdout.splitlines()
    assert said[said.index("--speculative-draft-model-path") + 1] == str(moved.resolve() / "draft")
    # transformers 4.x (which some vLLM and SGLang releases pin) knows this tokenizer class
    config = json.loads((moved / "draft" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_the_bundles_draft_keeps_its_rope_base_for_transformers_4(tmp_path):
    """vLLM and SGLang builds on transformers 4.x read rope_theta, which 5 no longer writes:
    a draft exported without it serves at a base of 10000 and accepts next to nothing."""
    tok = make_tokenizer()
    target, draft = make_llama(len(tok), num_layers=2), make_llama(len(tok), num_layers=1, seed=1)
    for model in (target, draft):  # SmolLM2-135M's base
        model.config.rope_parameters = {"rope_theta": 100000.0, "rope_type": "default"}
    out = export_bundle(str(save_model(target, tok, tmp_path / "t")),
                        str(save_model(draft, tok, tmp_path / "d")), tmp_path / "b", k=2)
    config = json.loads((out / "draft" / "config.json").read_text())
    assert config["rope_theta"] == 100000.0 and config["rope_scaling"] is None
