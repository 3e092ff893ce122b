"""The reference pages, read from the code: each is a view of the one place its facts live.

- commands: every command's parser, as ``draftkit COMMAND --help`` builds it
  (:func:`draftkit.cli.build_parser`, from each command's args dataclass);
- recipe keys: the recipe dataclasses, as ``draftkit distill --help`` lists them
  (:func:`draftkit.config.recipe_keys`);
- the bundle manifest: :class:`draftkit.manifest.Manifest` and its records, each field with the
  comments beside it in the source;
- metrics: the series :class:`draftkit.serve.metrics.ServeMetrics` registers;
- exit statuses: the ``EXIT_*`` constants of :mod:`draftkit.errors` and their comments.

Each page function returns Markdown; :mod:`draftkit.labs.sitegen.build` writes them. The helpers
here (cells, tables, docstrings and comments as prose) serve the other generated pages too.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import re
import textwrap
import tokenize
import types
import typing
from pathlib import Path

from draftkit import errors
from draftkit.cli import COMMANDS, args_class, build_parser
from draftkit.config import recipe_keys
from draftkit.fields import hints, type_name
from draftkit.manifest import Manifest
from draftkit.records import Record
from draftkit.serve import metrics

PACKAGE = Path(__file__).resolve().parents[2]  # draftkit/


# --- Markdown helpers ---------------------------------------------------------------------------

def cell(text: object) -> str:
    """``text`` as one table cell: no line breaks, its pipes and markup characters escaped."""
    text = " ".join(str(text).split())
    return text.replace("|", "\\|").replace("<", "&lt;").replace("*", "\\*")


def code(text: object) -> str:
    """``text`` as inline code (a pipe in it does not split a table's row)."""
    return f"`{text}`" if str(text) else ""


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table, and the blank line that ends it."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows), ""]


def prose(obj: object) -> str:
    """A docstring as Markdown: Sphinx roles (``:func:`x```) and double backticks become plain
    inline code."""
    doc = inspect.getdoc(obj) or ""
    doc = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", doc)
    return doc.replace("``", "`")


def generated(sources: str) -> str:
    return f"*Generated from {sources} when the site is built; edit those, not this page.*\n"


def notes(source: str) -> dict[str, str]:
    """Name -> what the source says of it, for each name assigned at the top level of
    ``source`` (a module, or one class): the comment lines right above the assignment, then the
    comment at the end of its line(s)."""
    source = textwrap.dedent(source)
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, alone on its line)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = (tok.string.lstrip("#").strip(),
                                      tok.line.strip().startswith("#"))
    tree = ast.parse(source)
    one_class = len(tree.body) == 1 and isinstance(tree.body[0], ast.ClassDef)
    body = tree.body[0].body if one_class else tree.body
    found: dict[str, str] = {}
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        else:
            continue
        above, line = [], node.lineno - 1
        while line in comments and comments[line][1]:
            above.insert(0, comments[line][0])
            line -= 1
        after = [comments[n][0] for n in range(node.lineno, node.end_lineno + 1)
                 if n in comments and not comments[n][1]]
        for name in names:
            found[name] = " ".join(above + after)
    return found


# --- commands -----------------------------------------------------------------------------------

def _value(action: argparse.Action) -> str:
    if action.nargs == 0:  # a switch
        return ""
    if action.choices:
        return " \\| ".join(code(c) for c in action.choices)
    return code(action.metavar or action.dest.upper())


def _flag_rows(parser: argparse.ArgumentParser) -> list[tuple[str | None, list[list[str]]]]:
    """(group title or None, rows) for each group of ``parser``'s arguments, ``--help`` left
    out (every command has it)."""
    # argparse's own groups and help expansion (%(default)s), as --help prints them
    formatter = parser._get_formatter()
    groups = []
    for group in parser._action_groups:
        rows = []
        for action in group._group_actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue  # the commands have sections of their own
            names = ", ".join(code(o) for o in action.option_strings) or code(action.dest)
            text = formatter._expand_help(action) if action.help else ""
            rows.append([names, _value(action), cell(text)])
        if rows:
            default = group.title in ("positional arguments", "options", "optional arguments")
            groups.append((None if default else group.title, rows))
    return groups


def commands_page() -> str:
    """Every command with its usage and every flag, from the parsers ``draftkit`` runs."""
    parser = build_parser()
    out = ["# Commands and flags", "", generated("each command's args dataclass, through "
                                                 "`draftkit.cli.build_parser`"),
           "`draftkit COMMAND --help` prints the same. Every command also takes `-h`, `--help`. "
           "A flag's default is in its description; the decoding flags mean the same in every "
           "command that takes them.", "", "## draftkit", "", "```",
           parser.format_usage().strip(), "```", ""]
    for _, rows in _flag_rows(parser):
        out += table(["flag", "value", "what it does"], rows)
    for command in COMMANDS:
        name, help_text = command.name, command.help
        sub = parser.commands[name]
        out += [f"## draftkit {name}", "", inspect.cleandoc(sub.description or help_text), "",
                "```", sub.format_usage().strip(), "```", ""]
        recipe = getattr(args_class(command), "recipe_config", None)
        if recipe is not None:
            out += ["Its recipe's keys (YAML, or `KEY=VALUE` after the recipe) are in "
                    "[recipe keys](recipe-keys.md).", ""]
        for title, rows in _flag_rows(sub):
            if title:
                out += [f"**{cell(title)}**", ""]
            out += table(["flag", "value", "what it does"], rows)
    return "\n".join(out)


def all_flags() -> dict[str, list[str]]:
    """Command ("" for ``draftkit`` itself) -> every flag and positional its parser takes but
    ``--help``: what the commands page must list."""
    parser = build_parser()
    found = {}
    for name, sub in [("", parser), *parser.commands.items()]:
        found[name] = [o for a in sub._actions if not isinstance(a, argparse._HelpAction)
                       for o in (a.option_strings or [a.dest]) if name or a.dest != "command"]
    return found


def flag_helps() -> list[tuple[str, str]]:
    """(``draftkit COMMAND --flag``, its help) for every flag of every command."""
    parser = build_parser()
    return [(f"draftkit {name} {action.option_strings[0]}", action.help or "")
            for name, sub in parser.commands.items() for action in sub._actions
            if action.option_strings]


# --- recipe keys --------------------------------------------------------------------------------

def _recipe_classes() -> list[tuple[type, list[str]]]:
    """(recipe dataclass, the commands that read it) for each command's ``recipe_config``."""
    found: dict[type, list[str]] = {}
    for command in COMMANDS:
        recipe = getattr(args_class(command), "recipe_config", None)
        if recipe is not None:
            found.setdefault(recipe, []).append(command.name)
    return list(found.items())


def _section(cls: type, path: str) -> type:
    """The dataclass at dotted ``path`` (``data.sources[]``) of ``cls``."""
    for part in path.split("."):
        tp = typing.get_type_hints(cls)[part.removesuffix("[]")]
        tp = next((a for a in typing.get_args(tp) if a is not type(None)), tp) \
            if typing.get_origin(tp) in (typing.Union, types.UnionType) else tp
        cls = typing.get_args(tp)[0] if part.endswith("[]") else tp
    return cls


def recipe_keys_page() -> str:
    """Every recipe key, a table per section, from the recipe dataclasses."""
    out = ["# Recipe keys", "", generated("the recipe dataclasses, through "
                                          "`draftkit.config.recipe_keys`")]
    for cls, commands in _recipe_classes():
        out += [f"Read by {', '.join(f'`draftkit {c}`' for c in commands)}, as "
                f"`draftkit {commands[0]} --help` lists them: a YAML recipe of these keys, "
                f"sections as nested mappings; `KEY=VALUE` after the recipe overrides one "
                f"(dotted for a section's key: `train.lr=1e-4`). An unknown or mistyped key is "
                f"an error that names the key and the file. `[]` marks a list item's keys.", "",
                prose(cls), ""]
        sections: dict[str, list] = {}
        for key in recipe_keys(cls):
            sections.setdefault(key.name.rpartition(".")[0], []).append(key)
        for path, keys in sections.items():
            out += [f"## {path or 'top level'}", ""]
            if path:
                out += [prose(_section(cls, path)), ""]
            out += table(["key", "default", "type", "what it is"],
                         [[code(k.name), code(k.default), cell(k.type), cell(k.help)]
                          for k in keys])
    return "\n".join(out)


# --- the bundle manifest ------------------------------------------------------------------------

def _record_in(tp) -> tuple[type | None, bool]:
    """(the record a field of type ``tp`` holds, whether a mapping of them), or (None, False):
    ``R``, ``R | None`` and ``dict[str, R]`` hold one."""
    inner = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(inner) == 1:
        tp = inner[0]
    if isinstance(tp, type) and issubclass(tp, Record):
        return tp, False
    item = typing.get_args(tp)[-1] if typing.get_origin(tp) is dict else None
    if isinstance(item, type) and issubclass(item, Record):
        return item, True
    return None, False


def _records(cls: type, prefix: str) -> list[tuple[str, type]]:
    """(dotted prefix, record) for ``cls`` and every record in it, depth first."""
    found = [(prefix, cls)]
    for f in dataclasses.fields(cls):
        record, mapping = _record_in(typing.get_type_hints(cls)[f.name])
        if record is not None:
            found += _records(record, f"{prefix}{f.name}.{'NAME.' if mapping else ''}")
    return found


def manifest_page() -> str:
    """Every key of a bundle's ``draftkit.json``, from the manifest's records."""
    out = ["# Bundle manifest", "", generated("the records of `draftkit/manifest.py`"),
           "`draftkit export` writes `draftkit.json` at the top of a bundle; `draftkit check` "
           "and every command that loads the bundle read it back, and refuse a key no field "
           "below names. A field marked *added later* is absent from bundles exported before "
           "it. `NAME` stands for a domain's name.", ""]
    for prefix, cls in _records(Manifest, ""):
        said = notes(inspect.getsource(cls))
        types_ = hints(cls)  # with the ranges and choices they carry
        rows = []
        for f in dataclasses.fields(cls):
            kind, text = type_name(types_[f.name]), cell(said.get(f.name, ""))
            record, _ = _record_in(typing.get_type_hints(cls)[f.name])
            if record is not None:  # its own section below says what it holds
                kind = kind.replace(record.__name__, "object")
                text = text or cell(prose(record).split(". ")[0].split("\n\n")[0])
            if f.metadata.get("omit_none"):
                text = (text + "; " if text else "") + "*added later*"
            rows.append([code(prefix + f.name), cell(kind), text])
        out += [f"## {prefix.rstrip('.') or 'top level'}", "", prose(cls), ""]
        out += table(["key", "type", "what it is"], rows)
    return "\n".join(out)


# --- metrics ------------------------------------------------------------------------------------

def metrics_page() -> str:
    """Every series of ``draftkit serve``'s ``/metrics``, from the registry the server builds."""
    from prometheus_client.metrics import MetricWrapperBase  # optional extra: serve

    served = metrics.ServeMetrics("MODEL")
    # series name -> its label names, from the metrics the server holds (a child metric
    # carries its parent's); the registry's families have the rest, labelled or not
    labels = {value._name: list(value._labelnames) for value in vars(served).values()
              if isinstance(value, MetricWrapperBase)}
    rows = []
    for family in served.registry.collect():
        if family.name not in labels:
            raise RuntimeError(f"{family.name} is registered but ServeMetrics holds no "
                               f"attribute for it: its labels cannot be listed")
        names = code(family.name + ("_total" if family.type == "counter" else ""))
        if family.type == "histogram":
            names += " (" + ", ".join(code(s) for s in ("_bucket", "_sum", "_count")) + ")"
        rows.append([names, family.type,
                     ", ".join(code(n) for n in labels[family.name]),
                     cell(family.documentation)])
    return "\n".join(["# Metrics", "", generated("`draftkit/serve/metrics.py`, by the registry "
                                                  "`ServeMetrics` builds"),
                      "`GET /metrics` on `draftkit serve`, in Prometheus' text format.", "",
                      prose(metrics), "", "## Series", "",
                      *table(["series", "type", "labels", "what it counts"], rows),
                      f"Latency histograms' buckets (seconds): "
                      f"{', '.join(map(str, metrics.LATENCY_BUCKETS))}.", ""])


# --- exit statuses ------------------------------------------------------------------------------

def exit_codes_page() -> str:
    """The CLI's exit statuses and the errors behind them, from :mod:`draftkit.errors`."""
    said = notes(inspect.getsource(errors))
    rows = sorted([getattr(errors, n), code(n), cell(said.get(n, ""))]
                  for n in vars(errors) if n.startswith("EXIT_"))
    kinds = [[code(c.__name__), code(c.__mro__[1].__name__), cell(prose(c))]
             for c in vars(errors).values()
             if isinstance(c, type) and issubclass(c, errors.DraftkitError)]
    return "\n".join(["# Exit statuses", "", generated("`draftkit/errors.py`"),
                      "What every `draftkit` command exits with, so a script tells wrong input "
                      "from a valid \"no\"; and the errors behind them.", "",
                      *table(["status", "constant", "meaning"],
                             [[str(v), n, t] for v, n, t in rows]),
                      "## Errors", "", prose(errors).split("\n\n")[1], "",
                      *table(["error", "is a", "what it is"], kinds)])
