"""The command line: subcommands listed, bad input as one line with a non-zero exit."""

import subprocess
import sys

import pytest

from draftkit.cli import COMMANDS, main


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "draftkit", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300,
                          env={**__import__("os").environ, "WANDB_MODE": "disabled"})


def test_help_lists_built_subcommands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for name, *_ in COMMANDS:
        assert name in out


def assert_one_line_error(proc, *fragments):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(lines) == 1, proc.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


def test_missing_model_path_is_one_line(tmp_path):
    proc = run_cli("derive", "--target", str(tmp_path / "nope"), "--layers", "0",
                   "--out", str(tmp_path / "d"))
    assert_one_line_error(proc, "not found: no such directory")
    assert not (tmp_path / "d").exists()


def test_derive_cli_writes_loadable_draft(tiny_dirs, tmp_path):
    target_dir, _ = tiny_dirs
    out = tmp_path / "derived"
    proc = run_cli("derive", "--target", str(target_dir), "--layers", "0,3", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out).config.num_hidden_layers == 2
    proc = run_cli("derive", "--target", str(target_dir), "--layers", "0", "--out", str(out))
    assert_one_line_error(proc, "already exists", "--force")
    proc = run_cli("derive", "--target", str(target_dir), "--out", str(tmp_path / "x"))
    assert_one_line_error(proc, "--layers")


def test_bad_flag_value_is_rejected(tmp_path):
    proc = run_cli("derive", "--layers", "a,b", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "expects int, got 'a'" in proc.stderr
