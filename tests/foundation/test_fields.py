"""One checker for every reader (draftkit/fields.py): a value walked down its field's type, the
bounds (Range) and choices (Literal, OneOf, option(choices=...)) the type carries checked, and a
failure one line that names the key and the file (a recipe), the flag (the command line) or the
dotted field (a record)."""

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import pytest

from draftkit.config import add_arguments, checked, from_namespace, load_recipe, option
from draftkit.errors import ConfigError
from draftkit.fields import FieldError, OneOf, Range, UnknownKey, read, type_name
from draftkit.records import Record


@dataclass
class Sizes:
    batch: Annotated[int, Range(low=1)] = option(4, help="rows per step")
    layers: list[Annotated[int, Range(low=0)]] = option([0, 1], help="tapped layers")


@dataclass
class Run:
    share: Annotated[float, Range(above=0, below=1, what="a share")] = option(0.5, help="held out")
    mode: Literal["fast", "exact"] = option("fast", help="how")
    device: str = option("cpu", choices=("cpu", "cuda"), help="where")
    minutes: Annotated[float, Range(above=0)] | None = option(None, help="time limit")
    sizes: Sizes = field(default_factory=Sizes, metadata={"help": "sizes"})


def recipe(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_bounds_and_types_in_words():
    assert [Range(low=1).words(), Range(above=0).words(), Range(high=8).words(),
            Range(low=0, high=1).words(), Range(above=0, below=1).words(),
            Range(above=0, high=1).words()] == [">= 1", "> 0", "<= 8", "in [0, 1]", "in (0, 1)",
                                                "in (0, 1]"]
    assert type_name(Annotated[int, Range(low=1)] | None) == "int >= 1 or null"
    assert type_name(list[Annotated[int, Range(low=0)]]) == "list of int >= 0"
    assert type_name(Annotated[str, OneOf(("a", "b"))]) == "'a' | 'b'"
    assert type_name(Sizes) == "Sizes"


@pytest.mark.parametrize("value", [0, -3, 1.5e9 * float("inf"), float("nan"), True, "2"])
def test_a_range_refuses_what_is_outside_it_or_no_finite_number(value):
    tp = Annotated[float, Range(low=1, high=1e9)]
    with pytest.raises(FieldError) as e:
        read(value, tp, "train.steps")
    assert e.value.key == "train.steps" and e.value.bound
    assert e.value.said() == f"must be in [1, 1000000000.0], got {value!r}"
    assert read(3, tp, "train.steps") == 3 and read(None, tp | None, "x") is None


def test_a_recipe_names_the_key_and_the_file(tmp_path):
    cases = [  # (YAML, what the one line says after the file)
        ("sizes:\n  batch: 0\n", "key 'sizes.batch' must be >= 1, got 0"),
        ("sizes:\n  layers: [0, -1]\n", "key 'sizes.layers' must be >= 0, got -1"),
        ("sizes:\n  layers: [0, x]\n",
         "key 'sizes.layers' expects int >= 0, got 'x'; fix the value"),
        ("share: 1\n", "key 'share' must be a share in (0, 1), got 1"),
        ("minutes: 0\n", "key 'minutes' must be > 0, got 0"),
        ("minutes: soon\n", "key 'minutes' expects float > 0 or null, got 'soon'; fix the value"),
        ("mode: slow\n", "key 'mode' must be one of 'fast', 'exact', got 'slow'"),
        ("device: tpu\n", "key 'device' must be one of 'cpu', 'cuda', got 'tpu'"),
        ("sizes: 3\n", "key 'sizes' is a section; give it a mapping of keys"),
        ("sizes:\n  batchh: 2\n", "unknown key 'sizes.batchh' (did you mean 'sizes.batch'?)"),
    ]
    for text, said in cases:
        path = recipe(tmp_path, text)
        with pytest.raises(ConfigError) as e:
            load_recipe(Run, path)
        assert str(e.value).startswith(f"{path}: {said}"), str(e.value)
        assert "\n" not in str(e.value)
    run = load_recipe(Run, recipe(tmp_path, "minutes: null\nsizes:\n  layers: [2, 3]\n"),
                      ["minutes=none", "device=cuda", "share=0.25"])
    assert (run.minutes, run.device, run.share, run.sizes) == (None, "cuda", 0.25, Sizes(4, [2, 3]))
    # the same mistake as an override names the command line
    with pytest.raises(ConfigError, match=r"^command line: key 'sizes\.batch' must be >= 1, "
                                          r"got 0$"):
        load_recipe(Run, recipe(tmp_path, "{}\n"), ["sizes.batch=0"])


@dataclass
class Flags:
    batch: Annotated[int, Range(low=1)] = option(4, help="rows per step")
    layers: list[Annotated[int, Range(low=0)]] | None = option(None, nargs="*", help="layers")
    device: str = option("cpu", choices=("cpu", "cuda"), help="where")


@pytest.mark.parametrize("words,said", [
    (["--batch", "0"], "--batch must be >= 1, got 0"),
    (["--layers", "1,-2"], "--layers must be >= 0, got -2"),
])
def test_a_flag_out_of_range_is_one_line_that_names_it(words, said):
    parser = argparse.ArgumentParser()
    add_arguments(parser, Flags)
    with pytest.raises(ConfigError) as e:
        from_namespace(Flags, parser.parse_args(words))
    assert str(e.value) == said
    # a dataclass built in code is checked the same way
    with pytest.raises(ConfigError, match="^--batch must be >= 1, got 0$"):
        checked(Flags(batch=0))
    assert checked(Flags(layers=[0, 3])).layers == [0, 3]
    with pytest.raises(ConfigError, match=r"^--device must be one of 'cpu', 'cuda', got 'tpu'$"):
        checked(Flags(device="tpu"))


@dataclass(kw_only=True)
class Inner(Record):
    alpha: Annotated[float, Range(low=0, high=1)] | None
    note: str | None = None


@dataclass(kw_only=True)
class Outer(Record):
    inner: Inner | None
    rows: dict[str, Inner] = field(default_factory=dict)


def test_records_read_leniently_or_strictly_with_their_ranges():
    data = {"inner": {"alpha": 0.5, "later": 1}, "rows": {"a": {"alpha": None}}, "new": 2}
    lenient = Outer.from_dict(data)  # unknown keys dropped, missing ones None
    assert lenient == Outer(inner=Inner(alpha=0.5), rows={"a": Inner(alpha=None)})
    with pytest.raises(UnknownKey) as e:
        Outer.from_dict(data, strict=True)
    assert e.value.key == "new"
    with pytest.raises(UnknownKey, match="inner.later"):
        Outer.from_dict({k: v for k, v in data.items() if k != "new"}, strict=True)
    with pytest.raises(UnknownKey, match="rows.a.beta"):
        Outer.from_dict({"rows": {"a": {"beta": 1}}}, strict=True)
    with pytest.raises(FieldError) as e:
        Outer.from_dict({"inner": [1]}, strict=True)
    assert (e.value.key, e.value.want) == ("inner", "a mapping")
    with pytest.raises(TypeError, match=r"^inner is \[1\], not a mapping$"):
        Outer.from_dict({"inner": [1]})  # leniently, no record either
    for strict in (False, True):  # a range holds either way
        with pytest.raises(FieldError) as e:
            Outer.from_dict({"rows": {"a": {"alpha": 1.5}}}, strict=strict)
        assert e.value.key == "rows.a.alpha" and e.value.said() == "must be in [0, 1], got 1.5"
