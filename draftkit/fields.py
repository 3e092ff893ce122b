"""Fields: a value checked against its field's type, and the bounds and choices that type carries.

A field's type says what it holds: ``int``, ``float``, ``str``, ``bool``, ``Path``, a
``Literal``'s values, ``X | None``, ``list[X]``, ``dict[K, V]``, a dataclass (a mapping of its
own keys). What a type alone cannot say rides on it in ``Annotated``, at any depth
(``list[Annotated[int, Range(low=1)]]``):

- :class:`Range`: a number's bounds (``Annotated[int, Range(low=1)]``: an integer >= 1);
- :class:`OneOf`: the values a field may take (a config ``option(choices=...)`` is one);
- :class:`Parsed`: a type read by a parser of its own (K: an integer or ``'auto'``).

:func:`read` walks a value down its type, once, for every reader: the config layer (recipes,
overrides and flags, :mod:`draftkit.config`), the records reader (JSON draftkit wrote,
:mod:`draftkit.records`) and the bundle manifest (:mod:`draftkit.manifest`). What differs
between them is their :class:`Reading`: whether text is converted or a value kept as JSON gave
it, how a section is built, whether null fits a field that is not optional. A value that does
not fit is a :class:`FieldError` naming its dotted key, which each reader writes as its one
line, naming the file or the flag.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Annotated, Any, Callable, Literal

from draftkit.errors import DraftkitError


class FieldError(DraftkitError):
    """A value that does not fit its field: its dotted ``key``, the ``value``, what was wanted
    (``want``, in words) and whether its type was wrong (``bound``: False) or it broke a bound or
    a choice (True)."""

    def __init__(self, key: str, value: Any, want: str, *, bound: bool = False):
        self.key, self.value, self.want, self.bound = key, value, want, bound
        super().__init__(f"{key} {self.said()}")

    def said(self) -> str:
        """What follows the key in a message: ``expects int, got 'x'``, ``must be >= 1, got 0``."""
        return f"{'must be' if self.bound else 'expects'} {self.want}, got {self.value!r}"


class UnknownKey(FieldError):
    """A key no field of the dataclass names (``key``: its dotted name)."""

    def __init__(self, key: str, value: Any):
        super().__init__(key, value, "a key of its record")


# --- what a type carries ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Range:
    """A number's bounds: ``low <= x``, ``above < x``, ``x <= high``, ``x < below`` (any of
    them), the number finite. ``what`` names the number in messages (``a share of the
    requests``)."""

    low: float | None = None
    above: float | None = None
    high: float | None = None
    below: float | None = None
    what: str = ""

    def words(self) -> str:
        """The bounds in words: ``>= 1``, ``> 0``, ``in [0, 1]``, ``in (0, 1]``."""
        lo = [(b, o) for b, o in ((self.low, "["), (self.above, "(")) if b is not None]
        hi = [(b, c) for b, c in ((self.high, "]"), (self.below, ")")) if b is not None]
        if lo and hi:
            return f"in {lo[0][1]}{lo[0][0]}, {hi[0][0]}{hi[0][1]}"
        if lo:
            return f"{'>=' if lo[0][1] == '[' else '>'} {lo[0][0]}"
        return f"{'<=' if hi[0][1] == ']' else '<'} {hi[0][0]}" if hi else "a finite number"

    def want(self) -> str:
        return f"{self.what} {self.words()}" if self.what else self.words()

    def fits(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value):
            return False
        return (self.low is None or value >= self.low) and \
            (self.above is None or value > self.above) and \
            (self.high is None or value <= self.high) and (self.below is None or value < self.below)


@dataclasses.dataclass(frozen=True)
class OneOf:
    """The values a field may take."""

    choices: tuple

    def want(self) -> str:
        return "one of " + ", ".join(repr(c) for c in self.choices)


@dataclasses.dataclass(frozen=True)
class Parsed:
    """Marks ``Annotated[T, Parsed(parse, name)]``: a field type read by ``parse``, which takes a
    YAML or JSON value or a command-line word and returns the field's value or raises
    (ValueError, TypeError or DraftkitError); ``name`` says what it expects, in errors and in
    help."""

    parse: Callable[[Any], Any]
    name: str


def parts(tp: Any) -> tuple[Any, bool, tuple]:
    """(the type bare, whether it is optional, its markers): ``Annotated`` and ``X | None`` taken
    off, in either order. ``int | str`` (two types, no None) stays a union."""
    marks: list = []
    optional = False
    while True:
        if typing.get_origin(tp) is Annotated:
            marks += tp.__metadata__
            tp = tp.__origin__
            continue
        args = typing.get_args(tp)
        if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 2 and \
                type(None) in args:
            optional, tp = True, next(a for a in args if a is not type(None))
            continue
        return tp, optional, tuple(marks)


def not_null(tp: Any) -> Any:
    """``tp`` without its ``| None``, its markers kept: what a value given must be (a flag is
    left out, not given null)."""
    inner, _, marks = parts(tp)
    return Annotated[(inner, *marks)] if marks else inner


def hints(cls: type) -> dict[str, Any]:
    """Each field's type with its markers, and with the choices its metadata names (a config
    ``option(choices=...)``) as a :class:`OneOf`."""
    out = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        if f.metadata.get("choices"):
            out[f.name] = Annotated[out[f.name], OneOf(tuple(f.metadata["choices"]))]
    return out


def choices(tp: Any) -> tuple | None:
    """The values a field of type ``tp`` may take (its ``Literal``'s, or its OneOf's), else None."""
    inner, _, marks = parts(tp)
    one_of = _marker(marks, OneOf)
    if one_of is not None:
        return one_of.choices
    return typing.get_args(inner) if typing.get_origin(inner) is Literal else None


def parser(tp: Any) -> Parsed | None:
    """The :class:`Parsed` marker of ``tp``, else None."""
    return _marker(parts(tp)[2], Parsed)


def type_name(tp: Any) -> str:
    """A field's type in words, as errors and help name it: ``float or null``, ``list of int``,
    ``int >= 1``."""
    inner, optional, marks = parts(tp)
    parsed, one_of = _marker(marks, Parsed), _marker(marks, OneOf)
    if parsed is not None:
        name = parsed.name
    elif one_of is not None or typing.get_origin(inner) is Literal:
        name = " | ".join(repr(a) for a in choices(tp))
    elif typing.get_origin(inner) is list:
        name = f"list of {type_name(typing.get_args(inner)[0])}"
    elif typing.get_origin(inner) is dict:
        name = "mapping of {} to {}".format(*map(type_name, typing.get_args(inner)))
    else:
        name = getattr(inner, "__name__", str(inner))
    name = " ".join([name] + [m.words() for m in marks if isinstance(m, Range)])
    return f"{name} or null" if optional else name


def _marker(marks: tuple, kind: type):
    return next((m for m in marks if isinstance(m, kind)), None)


# --- one walk -----------------------------------------------------------------------------------

class Reading:
    """How a reader takes values: what :func:`read` leaves to it. This one checks values as they
    are (a dataclass built in code, flags argparse converted): null fits any field, a scalar
    and a section are kept, bounds and choices are checked. The config layer and the records
    reader subclass it."""

    bounds = True  # whether Range and OneOf are checked (argparse converts; the checks come after)
    nulls = True  # whether null fits a field that is not optional (a figure not measured)

    def null(self, value: Any, optional: bool) -> bool:
        """Whether ``value`` is null (the config layer also takes the words null and none)."""
        return value is None

    def scalar(self, value: Any, tp: Any) -> Any:
        """``value`` as type ``tp`` (int, str, ...); ValueError or TypeError where it is not."""
        return value

    def items(self, value: Any) -> list | None:
        """The items of a list field's value; None keeps a value that is no list as it is."""
        return value if isinstance(value, (list, tuple)) else None

    def mapping(self, value: Any) -> dict | None:
        """A mapping field's value; None keeps a value that is no mapping as it is."""
        return value if isinstance(value, dict) else None

    def section(self, cls: type, value: Any, key: str) -> Any:
        """A dataclass field's value (the config layer and records build it from a mapping)."""
        return value


CHECK = Reading()


def read(value: Any, tp: Any, key: str, how: Reading = CHECK) -> Any:
    """``value`` read as type ``tp`` the way ``how`` reads, its bounds and choices checked, or a
    FieldError naming ``key`` (dotted: a mapping's items are ``key.item``)."""
    inner, optional, marks = parts(tp)
    if how.null(value, optional):
        if optional or how.nulls:
            return None
        raise FieldError(key, value, type_name(tp))
    parsed, origin = _marker(marks, Parsed), typing.get_origin(inner)
    if parsed is not None:
        try:
            value = parsed.parse(value)
        except (ValueError, TypeError, DraftkitError):
            raise FieldError(key, value, type_name(tp)) from None
    elif origin is Literal:
        value = _choose(value, typing.get_args(inner), key)
    elif origin is list:
        items = _shaped(how.items, value, key, tp)
        if items is not None:
            value = [read(v, typing.get_args(inner)[0], key, how) for v in items]
    elif origin is dict:
        mapping = _shaped(how.mapping, value, key, tp)
        if mapping is not None:
            key_tp, item_tp = typing.get_args(inner)
            value = {read(k, key_tp, key, how): read(v, item_tp, f"{key}.{k}", how)
                     for k, v in mapping.items()}
    elif dataclasses.is_dataclass(inner) and isinstance(inner, type):
        return how.section(inner, value, key)
    else:
        value = _shaped(how.scalar, value, key, tp, inner)
    for mark in marks if how.bounds else ():
        if isinstance(mark, Range) and not mark.fits(value):
            raise FieldError(key, value, mark.want(), bound=True)
        if isinstance(mark, OneOf):
            value = _choose(value, mark.choices, key)
    return value


def _shaped(step: Callable, value: Any, key: str, tp: Any, *more) -> Any:
    """``step(value, *more)``, a ValueError or TypeError it raises a FieldError."""
    try:
        return step(value, *more)
    except (ValueError, TypeError):
        raise FieldError(key, value, type_name(tp)) from None


def _choose(value: Any, allowed: tuple, key: str) -> Any:
    """The allowed value ``value`` is (given as text or as itself), or a FieldError."""
    for a in allowed:
        if value == a or (isinstance(value, str) and str(a) == value):
            return a
    raise FieldError(key, value, "one of " + ", ".join(repr(a) for a in allowed), bound=True)
