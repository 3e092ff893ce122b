"""A bundle is what it says at every door (issue 47): the careful user's probe of EAGLE-3
bundles, one test per case. Each edit is refused with one clear line and a non-zero exit (no
traceback), by the command that would otherwise have decoded, exported or launched it.

An edit that leaves the files' hashes stale is caught by the hash check every command runs on
load; an edit re-sealed by hand (``_rehash``: a faulty exporter, or a deliberate edit) is
caught by the head check (models/head_check.py) or by the manifest's own consistency
(manifest.check_consistent).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftkit.cli import main
from draftkit.models.head_check import TARGET_FILE, record_target
from draftkit.models.resolve import resolve_model
from tests.export.test_eagle3 import _rehash
from tests.helpers import make_llama, make_tokenizer, reseal, save_model, write_manifest


def _refused(capsys, argv: list[str], says: str) -> str:
    """``draftkit ARGV`` exits 2 (``check`` of a bundle: 3) with one error line that says
    ``says``, no traceback."""
    bundle = argv[0] == "check" and (Path(argv[1]) / "draftkit.json").is_file()
    status = main(argv)
    assert status == (3 if bundle else 2)  # a bundle that fails `check`: a valid "no"
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if (": error: " if status == 2 else ": no: ")
              in line]
    assert len(errors) == 1, err
    assert says in errors[0], errors[0]
    assert "Traceback" not in err
    return errors[0]


def _generate(draft: Path, target: Path) -> list[str]:
    return ["generate", "--target", str(target), "--draft", str(draft), "--prompt", "hello",
            "--max-new-tokens", "1", "--device", "cpu", "--k", "2"]


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def _edit_manifest(bundle: Path, change) -> None:
    """The manifest changed and sealed again, as a faulty exporter would write it."""
    manifest = json.loads((bundle / "draftkit.json").read_text())
    change(manifest)
    write_manifest(bundle, manifest)


def _swap_d2t(folder: Path, duplicate: bool = False) -> None:
    """Two draft ids' target ids swapped in d2t (t2d holds the same set), or the second's
    made the first's (``duplicate``)."""
    path = folder / "model.safetensors"
    state = load_file(str(path))
    ids = torch.arange(state["d2t"].numel()) + state["d2t"]
    if duplicate:
        ids[2] = ids[1]
    else:
        ids[[1, 2]] = ids[[2, 1]]
    state["d2t"] = ids - torch.arange(ids.numel())
    save_file(state, str(path), metadata={"format": "pt"})


# --- 1. the files' hashes, at every door -------------------------------------------------------

def test_generate_refuses_a_bundle_whose_head_was_edited(bundle, capsys):
    """Tapped layers edited to [2, 5, 5] in draft/config.json: decoded before, refused now."""
    out, target = bundle
    _edit_config(out / "draft", eagle_aux_hidden_state_layer_ids=[2, 5, 5])
    _refused(capsys, _generate(out, target), "bundle file draft/config.json does not match "
                                             "its sha256")


def test_generate_refuses_a_bundle_with_a_file_missing_or_added(bundle, capsys):
    out, target = bundle
    (out / "draft" / "pytorch_model.bin").write_bytes(b"not a head")
    _refused(capsys, _generate(out, target), "bundle holds a file its manifest does not list: "
                                             "draft/pytorch_model.bin")
    (out / "draft" / "pytorch_model.bin").unlink()
    (out / "draft" / "model.safetensors").unlink()
    _refused(capsys, _generate(out, target), "bundle file draft/model.safetensors is missing")


def test_export_does_not_launder_an_edited_bundle(bundle, tmp_path, capsys):
    """Tapped layers shifted to [3, 5, 6]: `export --draft BUNDLE` wrote a sealed bundle of the
    edit, which `check` passed; now the source bundle is refused and nothing is written."""
    out, target = bundle
    _edit_config(out / "draft", eagle_aux_hidden_state_layer_ids=[3, 5, 6],
                 eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 4, 5]})
    _refused(capsys, ["export", "--target", str(target), "--draft", str(out), "--out",
                      str(tmp_path / "again"), "--k", "2"],
             "bundle file draft/config.json does not match its sha256")
    assert not (tmp_path / "again").exists()


def test_export_refuses_a_resealed_edit_of_the_layers(bundle, tmp_path, capsys):
    """The same edit with the hashes rewritten: the manifest's record of the layers differs."""
    out, target = bundle
    _edit_config(out / "draft", eagle_aux_hidden_state_layer_ids=[3, 5, 6],
                 eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 4, 5]})
    _rehash(out)
    _refused(capsys, ["export", "--target", str(target), "--draft", str(out), "--out",
                      str(tmp_path / "again"), "--k", "2"],
             "draftkit.json records tapped layers [2, 4, 5] but draft/config.json [3, 5, 6]")
    _refused(capsys, ["check", str(out)], "records tapped layers [2, 4, 5] but "
                                          "draft/config.json [3, 5, 6]")


def test_the_bundles_preflight_checks_the_seal(bundle):
    """serving/preflight.py (what vllm.sh and sglang.sh run) refuses a manifest edited without
    its seal, and a draft file edited without its hash, before it prints a command."""
    out, _ = bundle
    preflight = [sys.executable, str(out / "serving" / "preflight.py"), "vllm", "0.34.0"]
    ran = subprocess.run(preflight, capture_output=True, text=True)
    assert ran.returncode == 0 and "--speculative-config" in ran.stdout, ran.stderr
    manifest = json.loads((out / "draftkit.json").read_text())
    manifest["serving"]["num_speculative_tokens"] = 9
    (out / "draftkit.json").write_text(json.dumps(manifest, indent=2))
    ran = subprocess.run(preflight, capture_output=True, text=True)
    assert ran.returncode == 1 and ran.stdout == ""
    assert ran.stderr.strip().count("\n") == 0 and "Traceback" not in ran.stderr
    assert "was edited after export: its content does not match its manifest_sha256" in \
        ran.stderr
    manifest["serving"]["num_speculative_tokens"] = 2
    write_manifest(out, manifest)  # sealed again: the seal is right, so a file must be
    _edit_config(out / "draft", eagle_aux_hidden_state_layer_ids=[2, 5, 5])
    ran = subprocess.run(preflight, capture_output=True, text=True)
    assert ran.returncode == 1 and ran.stdout == ""
    assert "bundle file draft/config.json does not match its sha256" in ran.stderr


# --- 2. one head check, in a bundle or loose -----------------------------------------------------

def test_a_loose_head_with_duplicated_layers_is_refused(head, capsys):
    folder, target = head
    _edit_config(folder, eagle_aux_hidden_state_layer_ids=[2, 5, 5],
                 eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 4, 4]})
    _refused(capsys, _generate(folder, target), "taps target layers [2, 5, 5]")


@pytest.mark.parametrize("duplicate", [False, True], ids=["permuted", "duplicated"])
def test_a_loose_head_with_a_permuted_d2t_is_refused(head, capsys, duplicate):
    folder, target = head
    _swap_d2t(folder, duplicate)
    _refused(capsys, _generate(folder, target), "d2t does not map draft ids to distinct "
                                                "ascending target ids")


def test_a_resealed_bundle_with_a_permuted_d2t_is_refused(bundle, capsys):
    out, target = bundle
    _swap_d2t(out / "draft")
    _rehash(out)
    _refused(capsys, _generate(out, target), "d2t does not map draft ids to distinct "
                                             "ascending target ids")


def test_a_loose_head_is_refused_beside_another_target(head, tmp_path, capsys):
    """A head saved with its target recorded (as distill's best/ is) decodes beside that target
    and is refused beside another of the same shape, at decode and at export."""
    folder, target = head
    record_target(folder, resolve_model(str(target)))
    assert json.loads((folder / TARGET_FILE).read_text())["path"] == str(target.resolve())
    assert main(_generate(folder, target)) == 0
    capsys.readouterr()
    tok = make_tokenizer()
    other = save_model(make_llama(len(tok), num_layers=8, seed=9), tok, tmp_path / "other")
    _refused(capsys, _generate(folder, other), "was trained for the target")
    _refused(capsys, ["export", "--target", str(other), "--draft", str(folder), "--out",
                      str(tmp_path / "b"), "--k", "2"], "was trained for the target")


def test_a_loose_head_without_a_record_is_refused_until_the_user_records_one(head, tmp_path,
                                                                             capsys):
    """A head that records no target (a published one) decodes and exports nowhere until
    ``draftkit check HEAD --target T --record-target`` says which target it reads; that
    check refuses a target the head does not fit, and a head that records another."""
    folder, target = head
    (folder / TARGET_FILE).unlink()
    for argv in (_generate(folder, target), ["export", "--target", str(target), "--draft",
                                             str(folder), "--out", str(tmp_path / "b"),
                                             "--k", "2"]):
        _refused(capsys, argv, "records no target (target.json")
    assert not (tmp_path / "b").exists()
    _refused(capsys, ["check", str(folder), "--target", str(target)], "--record-target")
    _refused(capsys, ["check", str(folder)], "pass --target")
    tok = make_tokenizer()
    shallow = save_model(make_llama(len(tok), num_layers=3, seed=9), tok, tmp_path / "shallow")
    _refused(capsys, ["check", str(folder), "--target", str(shallow), "--record-target"],
             "this target has 3 layers")
    assert not (folder / TARGET_FILE).exists()
    assert main(["check", str(folder), "--target", str(target), "--record-target"]) == 0
    assert "recorded" in capsys.readouterr().out
    assert main(_generate(folder, target)) == 0
    other = save_model(make_llama(len(tok), num_layers=8, seed=9), tok, tmp_path / "other")
    _refused(capsys, ["check", str(folder), "--target", str(other), "--record-target"],
             "was trained for the target")
    _refused(capsys, ["check", str(tmp_path / "shallow"), "--record-target"],
             "--record-target is for a loose EAGLE-3 head folder")


# --- 3. the manifest consistent with itself and its files ---------------------------------------

CONSISTENCY = [  # (edit of the manifest, re-sealed; what the refusal names)
    (lambda m: m.update(num_speculative_tokens=6),
     "draftkit.json num_speculative_tokens is 6 but serving.num_speculative_tokens is 2"),
    (lambda m: m["draft"].update(draft_vocab_size=999),
     "draftkit.json draft.draft_vocab_size is 999 but draft/config.json says 7"),
    (lambda m: m["draft"].update(dtype="float16"),
     "draftkit.json draft.dtype is float16 but serving.dtype is bfloat16"),
    (lambda m: m["serving"].update(target="/nowhere/target"),
     "serving.target is /nowhere/target but target.path is"),
]


@pytest.mark.parametrize("change,says", CONSISTENCY)
def test_a_manifest_that_disagrees_with_itself_is_refused(bundle, capsys, change, says):
    out, target = bundle
    _edit_manifest(out, change)
    _refused(capsys, ["check", str(out), "--target", str(target)], says)
    _refused(capsys, _generate(out, target), says)  # on load too


def test_a_dtype_stated_alike_twice_is_still_checked_against_the_weights(bundle, capsys):
    out, target = bundle

    def float16(m):
        m["draft"]["dtype"] = m["serving"]["dtype"] = "float16"
    _edit_manifest(out, float16)
    _refused(capsys, ["check", str(out)], "draft.dtype is float16 but draft/config.json "
                                          "says bfloat16")


def test_a_vllm_json_naming_another_head_is_refused(bundle, tmp_path, capsys):
    out, target = bundle
    spec = json.loads((out / "serving" / "vllm.json").read_text())
    (out / "serving" / "vllm.json").write_text(json.dumps(
        {**spec, "model": str(tmp_path / "other-head"), "num_speculative_tokens": 9}))
    reseal(out, vllm_json=False)
    _refused(capsys, ["check", str(out)], "serving/vllm.json names the draft at")
    (out / "serving" / "vllm.json").write_text(json.dumps({**spec, "num_speculative_tokens": 9}))
    reseal(out, vllm_json=False)
    _refused(capsys, ["check", str(out)], "serving/vllm.json says num_speculative_tokens 9 but "
                                          "draftkit.json's serving entry makes it 2")


# --- 4. recipes ----------------------------------------------------------------------------------

def test_a_ttt_decay_above_one_is_refused_at_dry_run(capsys):
    """draft.ttt_decay=2 passed --dry-run ("weighted 2^i") and trained."""
    recipe = Path(__file__).parents[2] / "recipes/smollm2-135m-instruct_to_eagle3/ttt_cpu.yaml"
    _refused(capsys, ["distill", str(recipe), "--dry-run", "draft.ttt_decay=2"],
             "command line: key 'draft.ttt_decay' must be in (0, 1], got 2.0")


# --- 5. caches checked by content ----------------------------------------------------------------

def _damage(path: Path, start: int, length: int, data: bytes | None = None) -> None:
    """``length`` bytes of ``path`` from ``start`` overwritten (zeros, or ``data``)."""
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(data if data is not None else bytes(length))


def test_a_damaged_teacher_cache_shard_is_named_and_rebuilt(tmp_path, tiny_dirs, monkeypatch,
                                                            capsys):
    """A teacher cache whose ids hold garbage gave an IndexError deep in training: now the
    shard is named, refused where no target is at hand, and built again where it is."""
    import numpy as np

    from draftkit.distill import teacher
    from draftkit.errors import DraftkitError
    from tests.helpers import distill_loaded

    monkeypatch.setattr(teacher, "SHARD_ROWS", 2)
    _, target, _, rows = distill_loaded(tmp_path, tiny_dirs)
    assert len(rows) >= 4
    cache = teacher.TopKCache(tmp_path / "c", rows, 8, 1.0, "k")
    cache.build(target, rows, 1, progress=False)
    ids = (tmp_path / "c" / "ids.i32").read_bytes()
    lo, hi = int(cache.offsets[2]) * 8 * 4, int(cache.offsets[4]) * 8 * 4  # rows 2..3
    _damage(tmp_path / "c" / "ids.i32", lo, hi - lo,
            np.random.default_rng(0).integers(2**20, 2**30, (hi - lo) // 4, np.int32).tobytes())
    with pytest.raises(DraftkitError, match=r"teacher cache .* rows 2\.\.3 \(shard 1\) do not "
                                            r"match their content hash"):
        teacher.TopKCache(tmp_path / "c", rows, 8, 1.0, "k").open()
    again = teacher.TopKCache(tmp_path / "c", rows, 8, 1.0, "k")
    again.build(target, rows, 1, progress=False)
    assert "rows 2..3 (shard 1) do not match their content hash (damaged on disk); building " \
           "them again" in capsys.readouterr().err
    assert (tmp_path / "c" / "ids.i32").read_bytes() == ids
    teacher.TopKCache(tmp_path / "c", rows, 8, 1.0, "k").open()


def test_a_zeroed_feature_cache_is_built_again_not_trained_on(tmp_path, tiny_dirs, capsys):
    """A zeroed feature cache trained silently (held-out tau stuck): every shard is named and
    built again before a run reads it."""
    from draftkit.distill.features import FeatureCache
    from tests.helpers import distill_loaded

    _, target, _, rows = distill_loaded(tmp_path, tiny_dirs)
    cache = FeatureCache(tmp_path / "f", rows, [1, 2, 3], target.config.hidden_size, "t")
    cache.build(target, rows, 4, progress=False)
    aux = (tmp_path / "f" / "aux.bf16").read_bytes()
    _damage(tmp_path / "f" / "aux.bf16", 0, len(aux))
    FeatureCache(tmp_path / "f", rows, [1, 2, 3], target.config.hidden_size, "t").build(
        target, rows, 4, progress=False)
    assert "feature cache" in capsys.readouterr().err
    assert (tmp_path / "f" / "aux.bf16").read_bytes() == aux


# --- 6. smaller ----------------------------------------------------------------------------------

def test_export_names_the_bundle_not_its_temporary_folder(exported, tmp_path, monkeypatch,
                                                          capsys):
    from draftkit.errors import ModelError
    from draftkit.export import eagle3

    def refuse(folder):
        raise ModelError(f"{folder}/config.json: refused for the test")
    monkeypatch.setattr(eagle3, "check_served_layout", refuse)
    target, head, _ = exported
    out = tmp_path / "b"
    line = _refused(capsys, ["export", "--target", str(target), "--draft", str(head), "--out",
                             str(out), "--k", "2"], f"{out}/draft/config.json: refused")
    assert ".tmp" not in line and not out.exists()
