"""K (num_speculative_tokens): one type, one parser, one resolver, and the decoding flags the
commands share."""

import argparse
from dataclasses import dataclass, fields

import pytest

from draftkit.config import (add_arguments, checked, describe_keys, from_namespace, load_recipe,
                             option)
from draftkit.decode.args import GROUP, DecodingArgs, SamplingArgs, SpeculationArgs
from draftkit.decode.k import AUTO, K, K_MAX, check_k, parse_fixed_k, parse_k
from draftkit.decode.choice import resolve_k
from draftkit.decode.policy import KPolicy
from draftkit.errors import ConfigError, DraftkitError


@pytest.mark.parametrize("value,k", [(0, 0), (3, 3), ("3", 3), (" 12 ", 12), ("+2", 2),
                                     ("auto", "auto"), ("AUTO", "auto"), (" Auto ", "auto")])
def test_parse_k_reads_integers_and_auto(value, k):
    assert parse_k(value) == k and type(parse_k(value)) is type(k)


@pytest.mark.parametrize("value", [-1, "-1", "fast", "3.0", 3.0, True, None, "", "²"])
def test_parse_k_refuses_anything_else(value):
    with pytest.raises(DraftkitError, match=r"K \(num_speculative_tokens\) must be an integer "
                                            r">= 0 or 'auto', got "):
        parse_k(value)


@dataclass
class Decoding:
    k: K = option(AUTO, help="K")
    k_max: int = option(K_MAX, help="largest K")


def test_the_k_type_reads_yaml_and_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("k: auto\n")
    assert load_recipe(Decoding, recipe).k == "auto"
    recipe.write_text("k: 3\n")
    k = load_recipe(Decoding, recipe).k
    assert k == 3 and type(k) is int  # not YAML's int that keeps its text
    assert load_recipe(Decoding, recipe, ["k=auto"]).k == "auto"
    assert load_recipe(Decoding, recipe, ["k=5"]).k == 5
    recipe.write_text("k: -1\n")
    with pytest.raises(ConfigError, match=rf"^{recipe}: key 'k' expects an integer >= 0 or "
                                          r"'auto', got -1; fix the value"):
        load_recipe(Decoding, recipe)
    with pytest.raises(ConfigError, match=r"^command line: key 'k' expects an integer >= 0 or "
                                          r"'auto', got 'fast'"):
        load_recipe(Decoding, recipe, ["k=fast"])
    assert describe_keys(Decoding)[0].startswith("k = auto (an integer >= 0 or 'auto')")


@pytest.mark.parametrize("words,k", [([], "auto"), (["--k", "auto"], "auto"), (["--k", "3"], 3),
                                     (["--k=0"], 0)])
def test_the_k_flag(words, k):
    parser = argparse.ArgumentParser()
    add_arguments(parser, Decoding)
    assert from_namespace(Decoding, parser.parse_args(words)).k == k


@pytest.mark.parametrize("word", ["-1", "fast", "2.5"])
def test_a_bad_k_flag_is_one_error_that_names_it(word, capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser, Decoding)
    with pytest.raises(ConfigError) as e:
        from_namespace(Decoding, parser.parse_args(["--k", word]))
    assert str(e.value) == f"--k expects an integer >= 0 or 'auto', got '{word}'"
    # through the command line: one line, exit status 2, for every command with --k
    from draftkit.cli import main

    # (regimes, bench and refresh take a fixed K: the test below)
    for argv in (["generate", "--prompt", "hi"], ["eval", "--draft", "d"],
                 ["serve", "--target", "t"], ["export", "--out", "o", "--draft", "d"]):
        assert main(argv + ["--k", word]) == 2
        err = capsys.readouterr().err
        # export records a fixed K: its other word is 'report' (draftkit/export/k.py)
        other = "report" if argv[0] == "export" else "auto"
        assert err == f"draftkit {argv[0]}: error: --k expects an integer >= 0 or '{other}', " \
                      f"got '{word}'\n"


def test_no_draft_means_k_0():
    for k in (AUTO, 0, 3, 20):
        choice = resolve_k(k, K_MAX, has_draft=False)
        assert (choice.fixed, choice.policy, choice.k_max, choice.label) == (0, None, 0, "0")
        assert choice.choose(4) == 0


def test_auto_is_the_policy_up_to_k_max():
    choice = resolve_k(AUTO, 5, has_draft=True)
    assert isinstance(choice.policy, KPolicy) and choice.policy.k_max == 5
    assert choice.k_max == 5 and choice.fixed is None and choice.label == "auto"
    assert resolve_k("auto", has_draft=True).policy.k_max == K_MAX
    # a policy that has learnt already (eval: across a domain's prompts) goes on learning
    learnt = KPolicy(k_max=3)
    choice = resolve_k(AUTO, 8, has_draft=True, policy=learnt)
    assert choice.policy is learnt and choice.k_max == 3


def test_a_fixed_k_is_also_the_most_a_round_drafts():
    choice = resolve_k(3, 8, has_draft=True)
    assert (choice.fixed, choice.policy, choice.k_max, choice.label) == (3, None, 3, "3")
    assert choice.choose(1) == choice.choose(16) == 3
    assert resolve_k("2", has_draft=True).fixed == 2  # the same parser as the flags
    # k_max bounds what auto may choose; a fixed K above it only where a command says so (eval:
    # its predictions and K sweep stop at k_max)
    assert resolve_k(5, 2, has_draft=True).k_max == 5
    with pytest.raises(ConfigError, match=r"^--k 5 is above --k-max 2; raise --k-max$"):
        resolve_k(5, 2, has_draft=True, bounded=True)
    assert check_k(2, 2, bounded=True) == 2 and check_k(AUTO, 0, bounded=True) == AUTO


@pytest.mark.parametrize("k,k_max", [(-1, 8), ("fast", 8), (3, -1)])
def test_the_resolver_refuses_what_the_parser_refuses(k, k_max):
    with pytest.raises(DraftkitError, match="must be"):
        resolve_k(k, k_max, has_draft=True)


# --- the flags the decoding commands share ------------------------------------------------------

SHARED = {f.name: f.metadata["help"] for cls in (SpeculationArgs, SamplingArgs)
          for f in fields(cls)}
# each command's shared flags: decoding ones where the command decodes with them
TAKES = {"generate": list(SHARED), "eval": list(SHARED), "serve": ["k", "k_max", "verify"],
         "regimes": ["k", "k_max", "seed"], "bench": ["k"]}


@pytest.mark.parametrize("command", sorted(TAKES))
def test_shared_flags_have_one_help_text_in_every_command(command):
    from draftkit.cli import build_parser

    parser = build_parser().commands[command]
    groups = {a.dest: g.title for g in parser._action_groups for a in g._group_actions}
    helps = {a.dest: a.help for a in parser._actions}
    for name in TAKES[command]:
        assert groups[name] == GROUP
        # the shared text, then a command's own note where its K must be fixed, then the default
        assert helps[name].startswith(SHARED[name])
    for name in set(SHARED) - set(TAKES[command]):
        assert name not in helps
    help_text = parser.format_help().replace("\n", " ")
    assert GROUP + ":" in help_text


def test_eval_takes_top_k_and_hands_it_to_its_settings():
    from draftkit.cli import build_parser, parse
    from draftkit.evaluate.args import EvalArgs
    from draftkit.evaluate.settings import EvalSettings

    args = from_namespace(EvalArgs, parse(build_parser(), ["eval", "--draft", "d", "--top-k",
                                                           "20", "--temperature", "0.7",
                                                           "--k", "2", "--seed", "4"]))
    assert (args.top_k, args.temperature, args.k, args.seed) == (20, 0.7, 2, 4)
    assert isinstance(args, EvalSettings)  # eval's flags are the measurements' settings
    assert (args.k_max, args.top_p, args.max_new_tokens) == (K_MAX, 1.0, 128)


@pytest.mark.parametrize("field,value,message", [
    ("temperature", -0.5, "--temperature must be a finite number >= 0 (0 = greedy), got -0.5"),
    ("top_p", 0.0, "--top-p must lie in (0, 1], got 0.0"),
    ("top_p", 1.5, "--top-p must lie in (0, 1], got 1.5"),
    ("top_k", -1, "--top-k must be >= 0 (0 = off), got -1"),
    ("k_max", -1, "--k-max must be >= 0, got -1"),
])
def test_decoding_args_check_as_the_engine_does(field, value, message):
    """The sampling checks are SamplingParams' own, named by their flags."""
    from draftkit.decode.args import GenerateArgs
    from draftkit.evaluate.args import EvalArgs

    for args in (DecodingArgs(), GenerateArgs(prompt="hi"), EvalArgs(draft="d")):
        setattr(args, field, value)
        with pytest.raises(ConfigError) as e:
            args.validate()
        assert str(e.value) == message


@pytest.mark.parametrize("word", ["auto", "0", "-1", "2.5"])
def test_commands_whose_measurement_needs_a_fixed_k_refuse_anything_else(word, capsys):
    """bench, regimes and refresh take one K for every round (FixedK): an integer >= 1, refused
    in one line that names --k, from the command line and for a dataclass built in code."""
    from draftkit.cli import main
    from draftkit.labs.bench_args import BenchArgs
    from draftkit.evaluate.args import RegimesArgs
    from draftkit.traffic.args import RefreshArgs

    for args in (BenchArgs(draft="d", prompts="p", k=word), RegimesArgs(k=word),
                 RefreshArgs(bundle="b", traffic="t", out="o", k=word)):
        with pytest.raises(ConfigError) as e:
            checked(args)
        assert str(e.value) == f"--k expects a fixed K (an integer >= 1), got '{word}'"
    for argv in (["bench", "--draft", "d", "--prompts", "p"], ["regimes"],
                 ["refresh", "b", "--traffic", "t", "--out", "o"]):
        assert main(argv + [f"--k={word}"]) == 2
        assert capsys.readouterr().err == f"draftkit {argv[0]}: error: --k expects a fixed K " \
                                          f"(an integer >= 1), got '{word}'\n"
    assert checked(BenchArgs(draft="d", prompts="p", k="2")).k == 2
    assert parse_fixed_k(3) == 3 and parse_fixed_k(" 4 ") == 4
