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


def test_help_imports_neither_torch_nor_a_command_module():
    """`draftkit --help` imports no command's module, args or function; `draftkit COMMAND
    --help` imports its args module alone (its dataclass), no function's module, and neither
    torch nor transformers: the CLI answers in a fraction of a second."""
    probe = ("import sys\nfrom draftkit.cli import main\ntry:\n    main(sys.argv[1:])\n"
             "except SystemExit:\n    pass\nprint(sorted(sys.modules))")
    functions = {c.module for c in COMMANDS}
    # but signing_args (keygen's flags), whose set_trusted the CLI calls for every command
    args_modules = {c.args_module for c in COMMANDS} - {"draftkit.signing_args"}
    for argv in [["--help"]] + [[c.name, "--help"] for c in COMMANDS]:
        ran = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True,
                             text=True, timeout=120)
        loaded = set(eval(ran.stdout.strip().splitlines()[-1]))
        assert not loaded & {"torch", "transformers"}, (argv, loaded & {"torch", "transformers"})
        assert not loaded & functions, (argv, loaded & functions)
        if argv == ["--help"]:
            assert not loaded & args_modules, loaded & args_modules


def test_distill_help_lists_every_recipe_key_and_each_one_loads(capsys, tmp_path):
    import re

    from draftkit.distill.command import load_config

    with pytest.raises(SystemExit):
        main(["distill", "--help"])
    out = capsys.readouterr().out
    keys = re.findall(r"^([a-z_.\[\]]+) = ", out, flags=re.M)
    assert {"train.lr", "data.generate.extra_samples", "data.sources[].path",
            "draft.lora.r"} <= set(keys)
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "hi", "domain": "code"}\n')
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"draft: {{num_layers: 1}}\ndata: {{sources: [{{path: {data}}}]}}\n")
    # every listed key is a real one: setting it to its listed default loads (but for the key
    # the recipe itself sets, whose default would leave the draft undefined)
    # (the default ends at the first " (": a type may hold brackets, "float in (0, 1]")
    for key, shown in re.findall(r"^([a-z_.]+) = (.+?) \(", out, flags=re.M):
        if key != "draft.num_layers":
            load_config(recipe, [f"{key}={shown}"])


def assert_one_line_error(proc, *fragments):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(lines) == 1, proc.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


@pytest.mark.slow  # starts draftkit in another Python
def test_missing_model_path_is_one_line(tmp_path):
    proc = run_cli("derive", "--target", str(tmp_path / "nope"), "--layers", "0",
                   "--out", str(tmp_path / "d"))
    assert_one_line_error(proc, "not found: no such directory")
    assert not (tmp_path / "d").exists()


@pytest.mark.slow  # starts draftkit in another Python
def test_derive_cli_writes_loadable_draft(tiny_dirs, tmp_path, capsys):
    target_dir, _ = tiny_dirs
    out = tmp_path / "derived"
    proc = run_cli("derive", "--target", str(target_dir), "--layers", "0,3", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out).config.num_hidden_layers == 2
    capsys.readouterr()
    # the refusals in this process (a subprocess start costs seconds; the one above and
    # test_missing_model_path_is_one_line run the entry point)
    for args, fragments in (
            (["--layers", "0", "--out", str(out)], ("already exists", "--force")),
            (["--out", str(tmp_path / "x")], ("--layers",))):
        code = main(["derive", "--target", str(target_dir), *args])
        assert_one_line_error(subprocess.CompletedProcess([], code, "", capsys.readouterr().err),
                              *fragments)
    assert main(["derive", "--target", str(target_dir), "--layers=", "--out",
                 str(tmp_path / "y")]) == 2
    assert "--layers names nothing; name some, or leave --layers out" in capsys.readouterr().err


@pytest.mark.slow  # starts draftkit in another Python
def test_bad_flag_value_is_rejected(tmp_path, capsys):
    for layers, said in (("-1,0", "--layers -1,0: layer indices count from 0"),
                         ("0,0,1", "--layers 0,0,1: layer 0 is given twice")):
        assert main(["derive", "--layers", layers, "--out", str(tmp_path / "x")]) == 2
        assert said in capsys.readouterr().err  # before any model loads
    assert not (tmp_path / "x").exists()
    proc = run_cli("derive", "--layers", "a,b", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "expects int, got 'a'" in proc.stderr


@pytest.mark.parametrize("words", [
    ["R.yaml", "seed=1", "max_steps=3", "--dry-run"],
    ["R.yaml", "--dry-run", "seed=1", "max_steps=3"],
    ["--dry-run", "R.yaml", "seed=1", "max_steps=3"],
    ["R.yaml", "seed=1", "--dry-run", "max_steps=3"],
])
def test_flags_may_sit_anywhere_among_the_overrides(words):
    from draftkit.cli import build_parser, parse

    ns = parse(build_parser(), ["distill", *words])
    assert (ns.command, ns.recipe, ns.overrides, ns.dry_run) == \
        ("distill", "R.yaml", ["seed=1", "max_steps=3"], True)


def test_a_stray_word_after_a_subcommand_is_still_an_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["derive", "--out", "d", "--layers", "0", "extra"])
    assert e.value.code == 2
    assert "unrecognized arguments: extra" in capsys.readouterr().err


@pytest.mark.parametrize("argv,field,value", [
    (["eval", "--draft", "d", "--domains", "code", "math"], "domains", ["code", "math"]),
    (["eval", "--draft", "d", "--domains", "code,math"], "domains", ["code", "math"]),
    (["eval", "--draft", "d", "--batch-sizes", "1,2"], "batch_sizes", [1, 2]),
    (["eval", "--draft", "d", "--batch-sizes="], "batch_sizes", []),
    (["regimes", "--batch-sizes", "1,2", "4"], "batch_sizes", [1, 2, 4]),
    (["regimes", "--temperatures", "0,1.5"], "temperatures", [0.0, 1.5]),
    (["regimes"], "layer_sizes", [1, 2, 4, 8, 15, 24, 30]),
    (["distill", "R.yaml", "data.sources=[{path: a, domain: b}]"], "overrides",
     ["data.sources=[{path: a, domain: b}]"]),  # an override's commas are its own
])
def test_list_flags_take_words_and_commas(argv, field, value):
    from draftkit.cli import args_class, build_parser, parse
    from draftkit.config import from_namespace

    command = next(c for c in COMMANDS if c.name == argv[0])
    args = from_namespace(args_class(command), parse(build_parser(), argv))
    assert getattr(args, field) == value


@pytest.mark.parametrize("argv,message", [
    (["generate", "--prompt", "hi", "--temperature", "nan"], "expects float, got 'nan'"),
    (["regimes", "--temperatures", "0,inf"], "expects float, got 'inf'"),
    (["eval", "--draft", "d", "--domains="], "--domains names nothing; name some, or leave "
                                             "--domains out\n"),
    (["regimes", "--domains"], "--domains names nothing"),
    (["bench", "--draft", "d", "--prompts", "p", "--methods="], "--methods is empty"),
    (["eval", "--draft", "d", "--k", "5", "--k-max", "2"], "--k 5 is above --k-max 2"),
])
def test_meaningless_values_are_one_line_errors(argv, message, capsys):
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    assert code == 2 and message in capsys.readouterr().err


def test_a_path_that_cannot_be_written_is_one_line(tiny_dirs, tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "draft"  # under a file: no folder can be made there
    assert main(["derive", "--target", str(tiny_dirs[0]), "--layers", "0",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"cannot use {tmp_path / 'afile'}" in err and "Traceback" not in err


def test_a_malformed_recipe_exits_2_in_one_line(tmp_path, capsys):
    """Exit statuses: 2 for bad input (this), 3 for a valid "no" (tests/traffic, check)."""
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("target: embedded\ndraft: [unclosed\n")
    assert main(["distill", str(recipe), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not valid YAML; fix the syntax" in err, err
