from dataclasses import dataclass
from pathlib import Path

import pytest

from draftkit.config import add_arguments, apply_overrides, from_namespace, load_recipe, option
from draftkit.errors import ConfigError


@dataclass
class Train:
    lr: float = option(1e-3, help="learning rate")
    layers: list[int] = option([0, 1], help="layers")


@dataclass
class NestedRecipe:
    out_dir: str = option("runs/x", help="output")
    max_steps: int = option(10, help="steps")
    seed: int = option(0, help="seed")
    train: Train = None  # type: ignore[assignment]

    def __post_init__(self):
        if self.train is None:
            self.train = Train()

    def validate(self):
        if self.max_steps <= 0:
            raise ConfigError("max_steps must be positive")


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "r.yaml"
    p.write_text(text)
    return p


def test_yaml_and_overrides_typed(tmp_path):
    p = write(tmp_path, "out_dir: a\nmax_steps: 5\ntrain:\n  lr: 0.01\n")
    cfg = load_recipe(NestedRecipe, p, ["max_steps=7", "train.layers=2,3", "seed=3"])
    assert cfg.out_dir == "a" and cfg.max_steps == 7 and cfg.seed == 3
    assert cfg.train.lr == 0.01 and cfg.train.layers == [2, 3]


def test_unknown_key_names_key_and_file(tmp_path):
    p = write(tmp_path, "out_dir: a\nmax_step: 5\n")
    with pytest.raises(ConfigError) as e:
        load_recipe(NestedRecipe, p)
    msg = str(e.value)
    assert "max_step" in msg and str(p) in msg and "did you mean 'max_steps'" in msg


def test_unknown_nested_key_and_bad_type(tmp_path):
    p = write(tmp_path, "train:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown key 'train\.lrr'"):
        load_recipe(NestedRecipe, p)
    p = write(tmp_path, "max_steps: ten\n")
    with pytest.raises(ConfigError, match=r"'max_steps' expects int, got 'ten'"):
        load_recipe(NestedRecipe, p)


def test_override_typo_and_validate(tmp_path):
    p = write(tmp_path, "out_dir: a\n")
    with pytest.raises(ConfigError, match=r"command line: unknown key 'max_stepz'"):
        load_recipe(NestedRecipe, p, ["max_stepz=3"])
    with pytest.raises(ConfigError, match="not key=value"):
        load_recipe(NestedRecipe, p, ["max_steps"])
    with pytest.raises(ConfigError, match=rf"{p}: max_steps must be positive"):
        load_recipe(NestedRecipe, p, ["max_steps=0"])


def test_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_recipe(NestedRecipe, write(tmp_path, "a: [1,\n"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_recipe(NestedRecipe, tmp_path / "nope.yaml")


def test_apply_overrides_parses_scalars():
    assert apply_overrides({"a": {"b": 1}}, ["a.c=true", "x=1e-4"]) == \
        {"a": {"b": 1, "c": True}, "x": 1e-4}


@dataclass
class Flags:
    target: str = option("embedded", help="target model")
    k: int = option(3, help="K")
    layers: list[int] | None = option(None, help="layers")
    json: bool = option(False, help="print JSON")


def test_flags_from_dataclass():
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser, Flags)
    ns = parser.parse_args(["--k", "5", "--layers", "0,2", "--json"])
    cfg = from_namespace(Flags, ns)
    assert cfg == Flags(target="embedded", k=5, layers=[0, 2], json=True)
    assert "target model (default: embedded)" in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["--k", "five"])
