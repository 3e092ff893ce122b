"""Records: dataclasses written as JSON objects, and read back from them.

A record's fields are its object's keys, in order; records nested in it (also in lists and
dicts) are objects of their own. ``from_dict(json.loads(text))`` then ``to_dict()`` gives the
same JSON back, value for value, so a file rewritten from its record keeps its bytes.

Reading is lenient, for files an earlier version wrote: a key the JSON lacks takes the field's
default, or None (a figure that version did not measure), and a key no field names is dropped,
except where a record keeps such keys (:func:`extra_keys`). That is why this is not
:func:`draftkit.config.from_dict`, which refuses unknown keys and converts values to the field's
type (an int to a float): right for a recipe a person wrote, wrong for a file to write back.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import field


def extra_keys() -> typing.Any:
    """A dict field whose items are written as keys of the record's own object, after the
    fields before it (declare it last); reading gives it every key no other field names."""
    return field(default_factory=dict, metadata={"extra": True})


def added_later() -> typing.Any:
    """A field a later version added: None by default, and its key left out of the JSON while
    it is None, so a file an earlier version wrote is written back byte for byte."""
    return field(default=None, metadata={"omit_none": True})


class Record:
    """A dataclass written as one JSON object: its fields in order, records nested in it (also
    in lists and dicts) as objects of their own."""

    def to_dict(self) -> dict:
        """The JSON object: plain dicts, lists, numbers, text and None."""
        out: dict = {}
        for f in dataclasses.fields(self):
            value = _written(getattr(self, f.name))
            if f.metadata.get("extra"):
                out.update(value)
            elif value is None and f.metadata.get("omit_none"):
                continue
            else:
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict):
        """The record of a JSON object (leniently: see the module's docstring)."""
        hints = _hints(cls)
        fields = dataclasses.fields(cls)
        named = {f.name for f in fields if not f.metadata.get("extra")}
        kwargs = {}
        for f in fields:
            if f.metadata.get("extra"):
                value = {k: v for k, v in data.items() if k not in named}
            elif data.get(f.name) is None and f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()  # a collection the file leaves out, or null
            else:
                value = data.get(f.name, None if f.default is dataclasses.MISSING else f.default)
            kwargs[f.name] = _read(value, hints[f.name])
        return cls(**kwargs)

    @classmethod
    def of(cls, source, **more):
        """A ``cls`` with the fields it shares with ``source`` (another dataclass) taken from it,
        the rest given in ``more``: a figure row extended, or narrowed to what a report keeps."""
        shared = {f.name for f in dataclasses.fields(cls)} & \
            {f.name for f in dataclasses.fields(source)}
        return cls(**{name: getattr(source, name) for name in shared - set(more)}, **more)


@functools.cache
def _hints(cls: type) -> dict:
    return typing.get_type_hints(cls)


def _written(value):
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, list):
        return [_written(v) for v in value]
    if isinstance(value, dict):
        return {k: _written(v) for k, v in value.items()}
    return value


def _read(value, tp):
    """``value`` as JSON gave it, its records (also in lists and dicts) built from their
    objects; numbers, text and None stay as they are."""
    if value is None:
        return None
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(inner) != 1:
            return value  # a plain value of one of several types (K: a number or 'auto')
        tp = inner[0]
    if isinstance(tp, type) and issubclass(tp, Record):
        return tp.from_dict(value)
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        return [_read(v, item) for v in value]
    if typing.get_origin(tp) is dict:
        _, item = typing.get_args(tp)
        return {k: _read(v, item) for k, v in value.items()}
    return value
