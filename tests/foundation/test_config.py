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
    # the value that breaks the check came from the command line, so that is what is named
    with pytest.raises(ConfigError, match=r"^command line: max_steps must be positive"):
        load_recipe(NestedRecipe, p, ["max_steps=0"])
    p = write(tmp_path, "max_steps: 0\n")
    with pytest.raises(ConfigError, match=rf"{p}: max_steps must be positive"):
        load_recipe(NestedRecipe, p)


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


# A str field keeps a number's text as written; YAML 1.1 would read 0123 as octal 83.
@pytest.mark.parametrize("raw", ["0123", "1.10", "1e-3", "1_000", "0x1F", ".5"])
def test_string_overrides_keep_their_text(tmp_path, raw):
    from draftkit.distill.config import DistillConfig

    p = write(tmp_path, "data:\n  sources:\n    - path: a.jsonl\n      domain: x\n")
    cfg = load_recipe(DistillConfig, p, [f"wandb.name={raw}", f"target={raw}"])
    assert (cfg.wandb.name, cfg.target) == (raw, raw)


def test_string_values_in_a_recipe_keep_their_text(tmp_path):
    from draftkit.distill.config import DistillConfig

    p = write(tmp_path, "wandb:\n  group: 0755\n  name: 2024.10\n"
                        "data:\n  sources:\n    - path: a.jsonl\n      domain: x\n"
                        "      split: 1e-3\n      columns: {0123: prompt}\n")
    cfg = load_recipe(DistillConfig, p)
    assert (cfg.wandb.group, cfg.wandb.name) == ("0755", "2024.10")
    assert cfg.data.sources[0].split == "1e-3" and cfg.data.sources[0].columns == {"0123": "prompt"}


def test_numbers_still_parse_and_come_out_plain(tmp_path):
    import yaml

    from draftkit.config import dump_yaml

    p = write(tmp_path, "max_steps: 1_000\ntrain:\n  lr: 1e-4\n  layers: [0x1, 2]\n")
    cfg = load_recipe(NestedRecipe, p, ["seed=2_0", "train.lr=.5"])
    assert (cfg.max_steps, cfg.seed, cfg.train.lr, cfg.train.layers) == (1000, 20, 0.5, [1, 2])
    assert type(cfg.max_steps) is int and type(cfg.train.lr) is float
    assert all(type(n) is int for n in cfg.train.layers)
    dump_yaml(cfg, tmp_path / "out.yaml")  # safe_dump refuses int and float subclasses
    assert yaml.safe_load((tmp_path / "out.yaml").read_text())["max_steps"] == 1000


def test_a_bad_override_value_names_the_command_line(tmp_path):
    p = write(tmp_path, "out_dir: a\n")
    with pytest.raises(ConfigError, match=r"^command line: key 'train\.lr' expects float, "
                                          r"got 'abc'"):
        load_recipe(NestedRecipe, p, ["train.lr=abc"])
    with pytest.raises(ConfigError, match=r"^command line: key 'train\.layers' expects int, "
                                          r"got 'x'"):
        load_recipe(NestedRecipe, p, ["train.layers=0,x"])
    with pytest.raises(ConfigError, match=r"^command line: key 'train' is a section"):
        load_recipe(NestedRecipe, p, ["train=3"])
    # the same mistake in the file still names the file
    with pytest.raises(ConfigError, match=rf"^{p}: key 'train\.lr' expects float"):
        load_recipe(NestedRecipe, write(tmp_path, "train:\n  lr: abc\n"))


def test_a_section_given_as_a_mapping_sets_those_keys_and_keeps_the_rest(tmp_path):
    """train={lr: 0.5} is train.lr=0.5: it replaced the whole section, so every other key of
    it fell back to its default without a word."""
    p = write(tmp_path, "train:\n  lr: 1e-4\n  layers: [1, 2]\n")
    cfg = load_recipe(NestedRecipe, p, ["train={lr: 0.5}"])
    assert (cfg.train.lr, cfg.train.layers) == (0.5, [1, 2])
    with pytest.raises(ConfigError, match=r"^command line: unknown key 'train\.bogus'"):
        load_recipe(NestedRecipe, p, ["train={bogus: 1}"])
    with pytest.raises(ConfigError, match=r"^command line: key 'train\.lr' expects float"):
        load_recipe(NestedRecipe, p, ["train={lr: abc}"])
