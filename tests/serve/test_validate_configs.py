"""serve/validate_configs.py: a bundle's serving configs read by the engines' own config classes.

The engines are not installed in the project's environment, so the tests here run the script
on a tiny bundle with no site-packages (``python -S``) and, on ``PYTHONPATH``, either nothing
or a stand-in ``vllm`` package: the skip path, and how an engine's refusal or rewrite becomes a
failure. The stand-in is not vLLM; it has the interface the script calls (EngineArgs' parser,
``create_engine_config``) and two of vLLM 0.33's rules, which the real release shows on this
bundle too (serve/README.md): it refuses an unknown method, and a draft path containing
``eagle3`` turns ``draft_model`` into ``eagle3``. Against the real engines: set
DRAFTKIT_TEST_VLLM_PYTHON / DRAFTKIT_TEST_SGLANG_PYTHON to an interpreter that has one.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "serve" / "validate_configs.py"

FAKE_ARG_UTILS = '''
import json
from types import SimpleNamespace as NS

METHODS = ("draft_model", "eagle3")


class EngineArgs:
    def __init__(self, model, speculative_config=None, dtype="auto"):
        self.model, self.speculative_config, self.dtype = model, speculative_config, dtype

    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--model")
        parser.add_argument("--speculative-config", type=json.loads)
        parser.add_argument("--dtype", default="auto")
        return parser

    @classmethod
    def from_cli_args(cls, ns):
        return cls(ns.model, ns.speculative_config, ns.dtype)

    def create_engine_config(self):
        spec = dict(self.speculative_config)
        if spec["method"] not in METHODS:
            raise ValueError(f"Unsupported speculative method: {spec['method']!r}")
        if "eagle3" in spec["model"].lower():
            spec["method"] = "eagle3"
        draft = NS(model=spec["model"], dtype=self.dtype, max_model_len=256)
        return NS(model_config=NS(model=self.model, dtype=self.dtype),
                  speculative_config=NS(**spec, draft_model_config=draft,
                                        draft_parallel_config=NS(tensor_parallel_size=1)))
'''


def fake_vllm(root: Path, arg_utils: str | None = FAKE_ARG_UTILS, failing_import: str = "") -> Path:
    """A ``vllm`` 0.33.0 stand-in under ``root``: ``arg_utils`` as vllm.engine.arg_utils, or
    a package whose import raises ``failing_import``."""
    pkg = root / "vllm"
    for sub in ("", "engine", "utils"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
        (pkg / sub / "__init__.py").write_text("")
    if failing_import:
        (pkg / "__init__.py").write_text(f"raise {failing_import}\n")
    (pkg / "config.py").write_text("class SpeculativeConfig:\n    pass\n")
    (pkg / "engine" / "arg_utils.py").write_text(arg_utils or "")
    (pkg / "utils" / "argparse_utils.py").write_text(
        "import argparse\nFlexibleArgumentParser = argparse.ArgumentParser\n")
    meta = root / "vllm-0.33.0.dist-info"
    meta.mkdir(exist_ok=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n")
    return root


def run(bundle: Path, path: Path | None, *args: str, python: str = sys.executable,
        isolated: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if path is not None:
        env["PYTHONPATH"] = str(path)
    cmd = [python, *(["-S"] if isolated else []), str(SCRIPT), str(bundle), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def bundle(tiny_dirs, tmp_path):
    from draftkit.export import export_bundle

    target_dir, draft_dir = tiny_dirs
    return export_bundle(str(target_dir), str(draft_dir), tmp_path / "bundle")


def edit_vllm_json(bundle: Path, **changes) -> None:
    path = bundle / "serving" / "vllm.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_an_engine_that_cannot_be_imported_is_skipped_in_one_line(bundle, tmp_path):
    fake = fake_vllm(tmp_path / "fake",
                     failing_import='OSError("libcudart.so.13: cannot open shared object file")')
    r = run(bundle, fake)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "skipped vLLM: importing it failed (OSError: libcudart.so.13: cannot open shared "
        "object file)",
        f"skipped SGLang: sglang is not installed for {sys.executable}"]


def test_a_config_the_engine_refuses_or_rewrites_fails(bundle, tmp_path):
    fake = fake_vllm(tmp_path / "fake")
    r = run(bundle, fake, "--engine", "vllm")
    assert r.returncode == 0, r.stdout + r.stderr
    ok = [line for line in r.stdout.splitlines() if ": ok: " in line]
    assert [line.split(": ok: ")[1].split(":")[0] for line in ok] == [
        "vllm.sh", "vllm.json (LLM(target, speculative_config=...))"]
    assert "method='draft_model', num_speculative_tokens=3" in ok[0]
    assert "configs built for its CPU platform (VLLM_TARGET_DEVICE=cpu)" in r.stdout

    edit_vllm_json(bundle, method="draft-model")
    r = run(bundle, fake, "--engine", "vllm")
    assert r.returncode == 1
    assert r.stdout.splitlines()[-1] == (
        "FAILED vLLM 0.33.0: vllm.json (LLM(target, speculative_config=...)): vLLM refused "
        "it: ValueError: Unsupported speculative method: 'draft-model'")

    moved = tmp_path / "eagle3-drafts" / "draft"
    edit_vllm_json(bundle, method="draft_model", model=str(moved))
    r = run(bundle, fake, "--engine", "vllm")
    assert r.returncode == 1
    assert f"vllm.json names the draft at {moved}" in r.stdout
    assert r.stdout.splitlines()[-1].endswith(
        "vLLM resolved the speculative config otherwise: method 'eagle3' (written "
        "'draft_model')")


def test_engine_flags_reach_the_scripts_check_and_bad_input_is_one_line(bundle, tmp_path):
    fake = fake_vllm(tmp_path / "fake")
    r = run(bundle, fake, "--engine", "sglang", "--", "--tp-size", "3")
    assert r.returncode == 0 and r.stdout.startswith("skipped SGLang")  # not installed here
    r = run(bundle, fake, "--", "--tp-size", "3")
    assert r.returncode == 2 and "pass --engine vllm or --engine sglang" in r.stderr
    r = run(tmp_path, fake)
    assert r.returncode == 2 and "is not a bundle with serving configs" in r.stderr


# vLLM: tests/engines/test_vllm.py runs this script under .venv-vllm, which make test builds
@pytest.mark.parametrize("engine", ["sglang"])
def test_the_real_engine_reads_the_bundle(bundle, engine):
    python = os.environ.get(f"DRAFTKIT_TEST_{engine.upper()}_PYTHON")
    if not python:
        pytest.skip(f"DRAFTKIT_TEST_{engine.upper()}_PYTHON names no interpreter with {engine}")
    r = run(bundle, None, "--engine", engine, python=python, isolated=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ": ok: " in r.stdout and "FAILED" not in r.stdout
