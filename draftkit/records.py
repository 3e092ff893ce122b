"""Records: dataclasses written as JSON objects, and read back from them.

A record's fields are its object's keys, in order; records nested in it (also in lists and
dicts) are objects of their own. ``from_dict(json.loads(text))`` then ``to_dict()`` gives the
same JSON back, value for value, so a file rewritten from its record keeps its bytes.

Reading is lenient, for files an earlier version wrote: a key the JSON lacks takes the field's
default, or None (a figure that version did not measure), and a key no field names is dropped,
except where a record keeps such keys (:func:`extra_keys`). That is why this is not
:func:`draftkit.config.from_dict`, which refuses unknown keys and converts values to the field's
type (an int to a float): right for a recipe a person wrote, wrong for a file to write back.
Values are walked down their fields' types by :func:`draftkit.fields.read`, as the config
layer's are, so the bounds and choices a field's type carries are checked here too.

``from_dict(data, strict=True)`` refuses what a lenient read drops: a key no field names (an
edited file, or a later version's) and an entry that is not the mapping its record reads, each
a :class:`~draftkit.fields.FieldError` naming its dotted key (the bundle manifest reads so).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import field

from draftkit import fields
from draftkit.fields import FieldError, UnknownKey


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
    def from_dict(cls, data: dict, *, strict: bool = False):
        """The record of a JSON object (leniently: see the module's docstring), or a TypeError
        where no object is; ``strict``: a key no field names, or an entry that is no mapping, is
        a FieldError."""
        return fields.read(data, cls, "", _STRICT if strict else _LENIENT)

    @classmethod
    def of(cls, source, **more):
        """A ``cls`` with the fields it shares with ``source`` (another dataclass) taken from it,
        the rest given in ``more``: a figure row extended, or narrowed to what a report keeps."""
        shared = {f.name for f in dataclasses.fields(cls)} & \
            {f.name for f in dataclasses.fields(source)}
        return cls(**{name: getattr(source, name) for name in shared - set(more)}, **more)


class _Json(fields.Reading):
    """Values as JSON gave them, kept as they are (null fits any field: a figure an earlier
    version did not measure); records built from their objects."""

    def __init__(self, strict: bool):
        self.strict = strict

    def section(self, cls, value, key):
        if not (isinstance(cls, type) and issubclass(cls, Record)):
            return value
        if not isinstance(value, dict):  # no JSON object where a record is read: no record
            if self.strict:
                raise FieldError(key, value, "a mapping")
            raise TypeError(f"{key or cls.__name__} is {value!r}, not a mapping")
        return _build(cls, value, key, self)


_LENIENT, _STRICT = _Json(strict=False), _Json(strict=True)


def _build(cls: type, data: dict, key: str, how: _Json):
    """The record ``cls`` of the JSON object ``data`` (named ``key``)."""
    hints, record_fields = _hints(cls), dataclasses.fields(cls)
    named = {f.name for f in record_fields if not f.metadata.get("extra")}
    if how.strict and len(named) == len(record_fields):  # a record keeping extra keys takes any
        unknown = next((k for k in data if k not in named), None)
        if unknown is not None:
            raise UnknownKey(_dotted(key, unknown), data[unknown])
    kwargs = {}
    for f in record_fields:
        if f.metadata.get("extra"):
            value = {k: v for k, v in data.items() if k not in named}
        elif data.get(f.name) is None and f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()  # a collection the file leaves out, or null
        else:
            value = data.get(f.name, None if f.default is dataclasses.MISSING else f.default)
        kwargs[f.name] = fields.read(value, hints[f.name], _dotted(key, f.name), how)
    return cls(**kwargs)


def _dotted(name: str, key: str) -> str:
    return f"{name}.{key}" if name else str(key)


@functools.cache
def _hints(cls: type) -> dict:
    return fields.hints(cls)


def _written(value):
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, list):
        return [_written(v) for v in value]
    if isinstance(value, dict):
        return {k: _written(v) for k, v in value.items()}
    return value
