"""Typed dataclasses as the single source for recipes, CLI flags and help.

A configuration is a (possibly nested) dataclass whose fields carry their help text in
``metadata``. The same class is read from three places, so they cannot drift apart:

- a YAML recipe (nested mappings for nested dataclasses),
- ``key=value`` overrides after the recipe (dotted keys reach nested fields: ``train.lr=1e-4``),
- ``--flags`` generated for argparse (flat dataclasses, inherited fields included, used by the
  subcommands; fields that several commands share may sit in an argparse group of their own).

Each value is read down its field's type by :func:`draftkit.fields.read`, which also checks
the bounds and choices the type carries (``Annotated[int, Range(low=1)]``, ``option(choices=...)``)
and reads a type with a parser of its own (K: an integer or ``'auto'``) through it.

Unknown or mistyped keys are errors that name the key and the file they came from; a key a
class renamed (its ``RENAMED`` table) still loads under its old name, with a line saying so.

Long: the three readers of one dataclass share its type checks and messages; apart they drift.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import re
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any

import yaml

from draftkit import fields
from draftkit.errors import ConfigError
from draftkit.fields import FieldError
from draftkit.io import atomic_write_text

_MISSING = dataclasses.MISSING


class _IntText(int):
    """An int read from YAML that keeps its text, so a str field gets ``0123`` as written."""

    text: str


class _FloatText(float):
    """A float read from YAML that keeps its text (``1.10``, ``1e-3``) for str fields."""

    text: str


class _Loader(yaml.SafeLoader):
    """PyYAML follows YAML 1.1, where ``1e-4`` is a string; recipes mean a float. A key given
    twice is an error (PyYAML would keep the last one without a word). Numbers keep their
    source text: a str field must not turn ``0755`` into ``'493'`` or ``2024.10`` into
    ``'2024.1'``, and it only learns that it wants a str after parsing."""

    def construct_yaml_int(self, node):
        number = _IntText(super().construct_yaml_int(node))
        number.text = node.value
        return number

    def construct_yaml_float(self, node):
        number = _FloatText(super().construct_yaml_float(node))
        number.text = node.value
        return number

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' is given twice; keep one", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _Loader.construct_yaml_float)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                             |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                             |\.[0-9_]+(?:[eE][-+][0-9]+)?
                             |[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def _yaml_load(text: str):
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def option(default: Any = _MISSING, *, help: str, choices: tuple | None = None,
           positional: bool = False, metavar: str | None = None, short: str | None = None,
           nargs: str | None = None, group: str | None = None) -> Any:
    """A dataclass field with its help text; lists and dicts get a fresh copy per instance.

    ``nargs`` (for list fields) takes several values from the command line as separate
    words, like argparse's ``nargs="*"``; other list fields take one comma-separated value.
    ``group`` titles the argparse group its flag is listed under in ``--help``.
    """
    meta = {"help": help, "choices": choices, "positional": positional, "metavar": metavar,
            "short": short, "nargs": nargs, "group": group}
    return _field(default, meta)


def _field(default: Any, meta: dict) -> Any:
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def reuse(cls: type, name: str, default: Any = _MISSING, *, note: str = "") -> Any:
    """Field ``name`` of dataclass ``cls`` declared again, for a class that does not inherit it
    or that needs another default: its help is ``cls``'s (``note`` appended), so a flag that
    several commands share is described once."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    meta = dict(f.metadata)
    meta["help"] += note
    return _field(_default(f) if default is _MISSING else default, meta)


# --- values -------------------------------------------------------------------------------------

def _default(f: dataclasses.Field) -> Any:
    """A field's default (a fresh one from its factory), or ``_MISSING`` for a required field."""
    if f.default is not _MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not _MISSING else _MISSING


class _Text(fields.Reading):
    """Values from YAML or the command line: text converted to the field's type, a section built
    by :func:`from_dict`, null only where the field is optional. ``bounds``: False where argparse
    converts a word (its bounds are checked after, so that a failure is one line)."""

    nulls = False

    def __init__(self, source: str, bounds: bool = True):
        self.source, self.bounds = source, bounds

    def null(self, value, optional):
        return value is None or (optional and isinstance(value, str) and
                                 value.lower() in ("null", "none"))

    def items(self, value):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise TypeError
        # a command-line word may hold several values: --batch-sizes 1,2 4
        words = [v.split(",") if isinstance(v, str) else [v] for v in value]
        return [p.strip() if isinstance(p, str) else p for w in words for p in w
                if not isinstance(p, str) or p.strip()]

    def mapping(self, value):
        if not isinstance(value, dict):
            raise TypeError
        return value

    def section(self, cls, value, key):
        if not isinstance(value, dict):
            raise ConfigError(f"{self.source}: key '{key}' is a section; give it a mapping of "
                              f"keys")
        return from_dict(cls, value, self.source, prefix=f"{key}.")

    def scalar(self, value, tp):
        if tp is bool:
            if isinstance(value, bool):
                return value
            word = value.lower() if isinstance(value, str) else None
            if word in ("true", "yes", "1", "on", "false", "no", "0", "off"):
                return word in ("true", "yes", "1", "on")
        elif tp is int and not isinstance(value, bool) and isinstance(value, (int, str)):
            return int(value)  # a plain int, without the YAML text
        elif tp is float and not isinstance(value, bool) and isinstance(value, (int, float, str)):
            number = float(value)
            if math.isfinite(number):  # not nan or inf
                return number
        elif tp in (str, Path):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                value = getattr(value, "text", str(value))  # as written: '0123', not '83'
            if isinstance(value, (str, Path)):
                return tp(value)
        raise TypeError(value)


def coerce(value: Any, tp: Any, key: str, source: str) -> Any:
    """Convert ``value`` (from YAML or a command line string) to ``tp`` or raise ConfigError."""
    try:
        return fields.read(value, tp, key, _Text(source))
    except FieldError as e:
        raise ConfigError(f"{source}: {_said(e)}") from None


def _said(e: FieldError) -> str:
    """A key's error after its source: ``key 'k' expects int, got 'x'; fix the value``."""
    return f"key '{e.key}' {e.said()}" + ("" if e.bound else "; fix the value")


# --- dicts and YAML -----------------------------------------------------------------------------

def from_dict(cls: type, data: dict, source: str, prefix: str = "") -> Any:
    """Build ``cls`` from a mapping; unknown keys and wrong types name the key and ``source``."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of keys at the top level")
    hints = fields.hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    renamed = _renamed(cls)
    for key, value in data.items():
        if key not in known and key in renamed:
            _say_renamed(prefix + key, prefix + renamed[key])
            if renamed[key] in data:  # given both, the new name wins
                continue
            key = renamed[key]
        if key not in known:
            close = _closest(str(key), known)
            hint = f" (did you mean '{prefix}{close}'?)" if close else ""
            raise ConfigError(f"{source}: unknown key '{prefix}{key}'{hint}; "
                              f"valid keys: {', '.join(prefix + f for f in known)}")
        kwargs[key] = coerce(value, hints[key], f"{prefix}{key}", source)
    missing = [n for n, f in known.items() if n not in kwargs and _default(f) is _MISSING]
    if missing:
        raise ConfigError(f"{source}: missing required key '{prefix}{missing[0]}'")
    cfg = cls(**kwargs)
    _validate(cfg, source)
    return cfg


def _renamed(cls: type) -> dict[str, str]:
    """Old key -> new key, for a config class that renamed some of its keys: its ``RENAMED``
    class attribute. The old name still loads, with one line on stderr naming the new one."""
    return getattr(cls, "RENAMED", {})


def _say_renamed(old: str, new: str) -> None:
    print(f"draftkit: {old} is deprecated; it is now {new}", file=sys.stderr, flush=True)


def _validate(cfg: Any, source: str) -> None:
    """Run a dataclass's own ``validate()`` (if any) and re-raise its message with the source."""
    check = getattr(cfg, "validate", None)
    if check is None:
        return
    try:
        check()
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def _closest(key: str, names) -> str | None:
    found = difflib.get_close_matches(key, list(names), n=1, cutoff=0.6)
    return found[0] if found else None


def to_dict(cfg: Any) -> dict:
    """A plain, YAML- and JSON-safe mapping of a config (Paths become strings)."""
    def clean(v):
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v
    return clean(dataclasses.asdict(cfg))


def _parse_override(item: str, source: str) -> tuple[str, Any]:
    """``key=value`` into the key and its value, parsed as a YAML scalar or flow collection."""
    if "=" not in item:
        raise ConfigError(f"{source}: override '{item}' is not key=value "
                          f"(for example max_steps=10)")
    key, raw = item.split("=", 1)
    try:
        value = _yaml_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def apply_overrides(data: dict, overrides: list[str] | list[tuple[str, Any]],
                    source: str = "command line") -> dict:
    """Merge ``key=value`` strings, or (key, value) pairs, into a raw mapping (dotted keys for
    sections).

    Values are parsed as YAML scalars so ``max_steps=10`` is an int and ``bf16=true`` a bool;
    the dataclass then checks the types.
    """
    data = dict(data)
    for item in overrides:
        key, value = _parse_override(item, source) if isinstance(item, str) else item
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            node[part] = dict(child) if isinstance(child, dict) else {}
            node = node[part]
        node[parts[-1]] = value
    return data


def load_recipe(cls: type, path: str | Path, overrides: list[str] | None = None) -> Any:
    """Read a YAML recipe into ``cls``, then apply ``key=value`` overrides."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"recipe {path} is a folder; pass one of its YAML files")
    if not path.is_file():
        raise ConfigError(f"recipe {path} does not exist; pass a YAML file, or a packaged "
                          f"recipe by its name under recipes/ (draftkit's share/recipes)")
    try:
        data = _yaml_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError:
        raise ConfigError(f"recipe {path} is not UTF-8 text; save it as UTF-8") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        if isinstance(e, yaml.constructor.ConstructorError) and "twice" in str(e.problem):
            raise ConfigError(f"{path}:{where}: {e.problem}") from None
        raise ConfigError(f"{path}:{where} is not valid YAML; fix the syntax") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of keys")
    # Overrides are checked against the class first so that a mistyped key or a bad value
    # names the command line, not the file.
    if not overrides:
        return from_dict(cls, data, str(path))
    merged = apply_overrides(data, _checked_overrides(cls, overrides))
    try:
        return from_dict(cls, merged, str(path))
    except ConfigError as e:
        # A check across keys failed. If the recipe alone passes it, an override broke it
        # (train.lr=-1): name the command line, not the file.
        try:
            from_dict(cls, data, str(path))
        except ConfigError:
            raise e from None
        raise ConfigError(f"command line: {str(e).removeprefix(f'{path}: ')}") from None


def _checked_overrides(cls: type, overrides: list[str]) -> list[tuple[str, Any]]:
    """(dotted key, value) of each override, once its key is found in ``cls`` and its value
    fits the key's type. A section given as a mapping (``train={lr: 1e-3, warmup_steps: 10}``)
    sets those keys of it, as ``train.lr=1e-3 train.warmup_steps=10`` would, and keeps the
    section's other keys."""
    pairs = []
    todo = [_parse_override(item, "command line") for item in overrides]
    while todo:
        key, value = todo.pop(0)
        node = cls
        parts = key.split(".")
        for i, part in enumerate(parts):
            names = {f.name: f for f in dataclasses.fields(node)}
            if part not in names and part in _renamed(node):
                parts[i] = part = _renamed(node)[part]
                _say_renamed(key, ".".join(parts))
                key = ".".join(parts)
            if part not in names:
                close = _closest(part, names)
                hint = f" (did you mean '{'.'.join(parts[:i] + [close])}'?)" if close else ""
                raise ConfigError(f"command line: unknown key '{key}'{hint}")
            tp = fields.hints(node)[part]
            if i < len(parts) - 1:
                node = fields.parts(tp)[0]
                if not dataclasses.is_dataclass(node):
                    raise ConfigError(f"command line: '{'.'.join(parts[:i + 1])}' is not a section")
        section = fields.parts(tp)[0]
        if dataclasses.is_dataclass(section) and isinstance(value, dict):
            todo[:0] = [(f"{key}.{k}", v) for k, v in value.items()]
            continue
        # converted again by from_dict once merged; checked here so that an error names its
        # source
        coerce(value, tp, key, "command line")
        pairs.append((key, value))
    return pairs


@dataclasses.dataclass(frozen=True)
class Key:
    """One leaf key of a nested config, as ``--help`` and the docs site's reference list it."""

    name: str  # dotted (train.lr); a list item's keys under key[] (data.sources[].path)
    default: str  # as YAML writes it, or "(required)"
    type: str  # in words: "float or null", "list of int"
    help: str


def recipe_keys(cls: type, prefix: str = "") -> list[Key]:
    """Every leaf key of a nested config, in declaration order, with its class's default.

    Nested dataclasses are walked (``train.lr``); a list of dataclasses shows its item's keys
    under ``key[]`` (``data.sources[].path``).
    """
    keys = []
    hints = fields.hints(cls)
    for f in dataclasses.fields(cls):
        tp = fields.parts(hints[f.name])[0]
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is list else None
        if dataclasses.is_dataclass(tp):
            keys += recipe_keys(tp, f"{prefix}{f.name}.")
            continue
        if item is not None and dataclasses.is_dataclass(item):
            keys += recipe_keys(item, f"{prefix}{f.name}[].")
            continue
        value = _default(f)
        shown = "(required)" if value is _MISSING else \
            yaml.safe_dump(value, default_flow_style=True).split("\n...")[0].strip()
        keys.append(Key(prefix + f.name, shown, fields.type_name(hints[f.name]),
                        f.metadata.get("help", "")))
    return keys


def describe_keys(cls: type) -> list[str]:
    """One entry per leaf key of a nested config (:func:`recipe_keys`): ``key = default
    (type)``, then its help, indented. The recipe help of a command is built from it."""
    return [f"{k.name} = {k.default} ({k.type})\n" +
            textwrap.fill(k.help, width=90, initial_indent="    ", subsequent_indent="    ")
            for k in recipe_keys(cls)]


def dump_yaml(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as YAML, atomically."""
    atomic_write_text(Path(path), yaml.safe_dump(to_dict(cfg), sort_keys=False))


# --- argparse -----------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one flag per field of a flat dataclass (inherited fields too), with its help, type
    and default; a field with a ``group`` is listed under that title, after the others."""
    hints = fields.hints(cls)
    groups: dict[str, Any] = {}
    for f in sorted(dataclasses.fields(cls), key=lambda f: f.metadata.get("group") is not None):
        meta = f.metadata
        title = meta.get("group")
        if title and title not in groups:
            groups[title] = parser.add_argument_group(title)
        tp = hints[f.name]
        inner = fields.parts(tp)[0]
        default = _default(f)
        required = default is _MISSING
        if required:
            default = None
        help_text = meta.get("help", "")
        if default not in (None, False, "", []) and "%(default)" not in help_text:
            shown = ",".join(map(str, default)) if isinstance(default, list) else default
            help_text += f" (default: {shown})"
        choices = fields.choices(tp)
        names = [f.name] if meta.get("positional") else (
            [f"--{f.name.replace('_', '-')}"] + ([meta["short"]] if meta.get("short") else []))
        kwargs: dict[str, Any] = {"help": help_text}
        if not meta.get("positional"):
            kwargs["dest"] = f.name
        if inner is bool and not meta.get("positional"):
            kwargs["action"] = argparse.BooleanOptionalAction if default else "store_true"
            kwargs["default"] = default
        else:
            if meta.get("nargs"):
                kwargs["nargs"] = meta["nargs"]
                if meta.get("positional"):  # words taken whole: an override may hold commas
                    tp = typing.get_args(inner)[0]
                # a flag's word may hold several values (--batch-sizes 1,2 4): each converts
                # to a list, joined in from_namespace
            if fields.parser(tp) is None:  # a parsed type's word is read in from_namespace
                kwargs["type"] = _argparse_type(tp, f.name)
            kwargs["metavar"] = meta.get("metavar") or (None if choices else f.name.upper())
            if choices:
                kwargs["choices"] = choices
            if meta.get("positional") and not meta.get("nargs"):
                if not required:
                    kwargs["nargs"] = "?"
                    kwargs["default"] = default
            else:
                kwargs["default"] = default
                if required and not meta.get("positional"):  # nargs "+" requires a word
                    kwargs["required"] = True
        groups.get(title, parser).add_argument(*names, **kwargs)


def _argparse_type(tp: Any, name: str):
    """A flag word converted to its field's type; its bounds are checked by from_namespace."""
    def convert(text: str):
        try:
            return fields.read(text, tp, name, _Text("command line", bounds=False))
        except FieldError as e:
            raise argparse.ArgumentTypeError(_said(e)) from None
    convert.__name__ = fields.type_name(tp)
    return convert


def from_namespace(cls: type, ns: argparse.Namespace) -> Any:
    """Build the dataclass from parsed flags, check each against its type (:func:`checked`) and
    run its ``validate()``."""
    kwargs = {f.name: getattr(ns, f.name) for f in dataclasses.fields(cls) if hasattr(ns, f.name)}
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        words = kwargs.get(f.name)
        if f.metadata.get("nargs") and not f.metadata.get("positional") and words and \
                all(isinstance(w, list) for w in words):
            kwargs[f.name] = [v for w in words for v in w]
        if kwargs.get(f.name) == [] and f.default is None:
            # unset (None) is how such a flag says "all" or "none": given empty, it is a slip
            raise ConfigError(f"{flag} names nothing; name some, or leave {flag} out")
    return checked(cls(**kwargs))


def checked(cfg: Any) -> Any:
    """``cfg``, a flat dataclass of flags (built by :func:`from_namespace`, or in code), with each
    field read against its type: a parsed type's word read (K), bounds and choices checked, a
    failure one line naming the flag (here rather than in argparse, which prints its usage
    first); then its ``validate()``."""
    hints = fields.hints(type(cfg))
    for f in dataclasses.fields(cfg):
        flag = f.name.upper() if f.metadata.get("positional") else \
            "--" + f.name.replace("_", "-")
        try:
            tp = fields.not_null(hints[f.name])  # None fits a check; a flag is not given null
            setattr(cfg, f.name, fields.read(getattr(cfg, f.name), tp, flag))
        except FieldError as e:
            raise ConfigError(f"{flag} {e.said()}") from None
    _validate(cfg, "command line")
    return cfg
