"""The one ``draftkit`` command. Each subcommand is a plain function taking a typed dataclass.

A subcommand is registered below (:class:`Command`) by its name, where its args dataclass lives
(a light module: the package's ``args.py``, which imports neither torch nor transformers) and
where its function lives (its ``command.py``, which imports what it uses at its top, torch
included). ``draftkit --help`` imports neither (the names and one-line helps are here);
``draftkit COMMAND --help`` imports that command's args module only, so it is fast too; ``draftkit
COMMAND ...`` imports the function's module once the flags are parsed. The dataclass is the
single source for the flags and their help. A subcommand is listed here only once it works.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from typing import NamedTuple

from draftkit import __version__
from draftkit.config import add_arguments, describe_keys, from_namespace
from draftkit.errors import (EXIT_DECLINED, EXIT_INTERRUPTED, EXIT_OK, EXIT_REFUSED, Declined,
                             DraftkitError)
from draftkit.signing_args import set_trusted


class Command(NamedTuple):
    """A subcommand: its flags' dataclass and its function, each named by its module."""

    name: str
    args_module: str  # light: imported for the command's flags (its --help)
    args: str  # the args dataclass in it
    module: str  # imported only when the command runs
    function: str  # in it, called with the args
    help: str  # one line, in ``draftkit --help``


COMMANDS: list[Command] = [Command(*c) for c in [
    ("quickstart", "draftkit.quickstart_args", "QuickstartArgs", "draftkit.quickstart",
     "quickstart", "run the whole loop on the embedded default target"),
    ("derive", "draftkit.models.args", "DeriveArgs", "draftkit.models.command", "derive",
     "derive a draft from a target (copy layers or shrink it)"),
    ("init", "draftkit.distill.args", "InitArgs", "draftkit.distill.init", "init",
     "write a commented EAGLE-3 recipe for your target and data"),
    ("distill", "draftkit.distill.args", "DistillArgs", "draftkit.distill.command", "distill",
     "distill a draft against the target's logits from a YAML recipe"),
    ("eval", "draftkit.evaluate.args", "EvalArgs", "draftkit.evaluate.command", "evaluate",
     "measure alpha, tau, c and speedup per domain and write a report"),
    ("regimes", "draftkit.evaluate.args", "RegimesArgs", "draftkit.evaluate.command", "regimes",
     "measure where speculation stops paying: entropy, draft cost, domain mismatch, batch size"),
    ("keygen", "draftkit.signing_args", "KeygenArgs", "draftkit.signing", "keygen",
     "make a key pair to sign bundles with, and to trust them by"),
    ("export", "draftkit.export.args", "ExportArgs", "draftkit.export.command", "export",
     "export a draft as a bundle that HF, vLLM and SGLang take as it is"),
    ("check", "draftkit.export.args", "CheckArgs", "draftkit.export.command", "check",
     "verify a bundle's hashes and its draft/target pairing"),
    ("generate", "draftkit.decode.args", "GenerateArgs", "draftkit.decode.command", "generate",
     "generate text, speculatively when given a draft"),
    ("bench", "draftkit.labs.bench_args", "BenchArgs", "draftkit.labs.bench", "bench",
     "tokens/s of our decoder against HF generate and assisted generation"),
    ("serve", "draftkit.serve.args", "ServeArgs", "draftkit.serve.command", "serve",
     "serve a bundle over an OpenAI-compatible HTTP API"),
    ("traffic", "draftkit.traffic.args", "TrafficArgs", "draftkit.traffic.command", "traffic",
     "served acceptance per domain beside the bundle's eval, with drift flagged"),
    ("import-traffic", "draftkit.traffic.args", "ImportArgs", "draftkit.traffic.logs",
     "import_traffic",
     "turn OpenAI-style request logs into traffic `draftkit traffic` and `refresh` read"),
    ("refresh", "draftkit.traffic.args", "RefreshArgs", "draftkit.traffic.refresh", "refresh",
     "retrain a bundle's draft on its recorded traffic; export it only where it is faster"),
]]


def args_class(command: Command) -> type:
    """The command's args dataclass, from its light module."""
    return getattr(importlib.import_module(command.args_module), command.args)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``draftkit`` parser: a subparser per command, its flags read from its dataclass.
    With ``only``, only that command's args module is imported and its flags added (the others
    are listed by name and help): ``draftkit --help`` imports none, ``draftkit COMMAND ...``
    one."""
    parser = argparse.ArgumentParser(
        prog="draftkit", description="Train, evaluate, export and serve draft models for "
                                     "speculative decoding.")
    parser.add_argument("--version", action="version", version=f"draftkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        name, help_text = command.name, command.help
        if only is not None and name != only:
            sub.add_parser(name, help=help_text)
            continue
        cls = args_class(command)
        kwargs = {}
        recipe = getattr(cls, "recipe_config", None)  # a command that reads a YAML recipe
        if recipe is not None:  # lists the recipe's keys, from the same dataclass
            kwargs = {"formatter_class": argparse.RawDescriptionHelpFormatter,
                      "epilog": "recipe keys (YAML; override with KEY=VALUE, dotted; [] marks "
                                "a list item):\n\n" + "\n".join(describe_keys(recipe))}
        p = sub.add_parser(name, help=help_text, description=(cls.__doc__ or help_text).strip(),
                           **kwargs)
        add_arguments(p, cls)
    parser.commands = sub.choices  # name -> its parser, for parse() below
    return parser


def command_word(argv: list[str]) -> str:
    """The command ``argv`` names: its first word that is not a flag (the top-level parser has
    no flag that takes a value); "" where there is none."""
    return next((w for w in argv if not w.startswith("-")), "")


def parse(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse ``argv``; a subcommand's flags may come before, between or after its positionals.

    Plain argparse ends a positional list at the first flag, so ``distill R.yaml --dry-run
    seed=1`` would reject ``seed=1``; the subcommand's words are parsed intermixed instead.
    """
    args = _negative_values(list(sys.argv[1:] if argv is None else argv))
    ns = parser.parse_known_args(args)[0]
    if not ns.command:
        return parser.parse_args(args)
    # the top-level parser has no option that takes a value, so the first match is the command
    words = args[args.index(ns.command) + 1:]
    return parser.commands[ns.command].parse_intermixed_args(
        words, namespace=argparse.Namespace(command=ns.command))


def _negative_values(words: list[str]) -> list[str]:
    """``--layers -1,0`` as ``--layers=-1,0``: argparse takes a word starting with '-' for a
    flag unless it is one plain negative number, and would say "expected one argument"."""
    out: list[str] = []
    for word in words:
        if out and out[-1].startswith("--") and "=" not in out[-1] and \
                len(word) > 1 and word[0] == "-" and (word[1].isdigit() or word[1] == "."):
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out


def _quiet_libraries() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _cpu_accelerator_for_deepspeed() -> None:
    """Where a library imports DeepSpeed (transformers does) on a machine without a GPU,
    DeepSpeed warns "Setting accelerator to CPU. If you have GPU ...": name CPU up front."""
    if "DS_ACCELERATOR" in os.environ or importlib.util.find_spec("deepspeed") is None:
        return
    import torch  # local: the CLI's own imports stay light, for --help

    mps = getattr(torch.backends, "mps", None)
    if not torch.cuda.is_available() and not (mps and mps.is_available()):
        os.environ["DS_ACCELERATOR"] = "cpu"


def main(argv: list[str] | None = None) -> int:
    _quiet_libraries()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(command_word(argv))
    ns = parse(parser, argv)
    if not ns.command:
        parser.print_help()
        return EXIT_REFUSED
    command = next(c for c in COMMANDS if c.name == ns.command)
    _cpu_accelerator_for_deepspeed()
    try:
        args = from_namespace(args_class(command), ns)
        set_trusted(getattr(args, "trusted_key", None))  # every bundle this process loads
        run = getattr(importlib.import_module(command.module), command.function)
        run(args)
    except Declined as e:  # before DraftkitError, of which it is one
        print(f"draftkit {ns.command}: no: {e}", file=sys.stderr)
        return EXIT_DECLINED
    except DraftkitError as e:
        print(f"draftkit {ns.command}: error: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except OSError as e:
        if e.filename is None:  # not about a path the user gave: a bug, keep the traceback
            raise
        print(f"draftkit {ns.command}: error: cannot use {e.filename} ({e.strerror}); check "
              f"the path (a folder where one is expected, a file where one is) and its "
              f"permissions", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        print(f"draftkit {ns.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK  # an unexpected error escapes with its traceback: EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
