"""Every recipe under recipes/ parses, type-checks and names files that exist.

YAML recipes go through the same path as ``draftkit distill RECIPE --dry-run``;
recipes/deepspeed/*.json are checked for the keys DeepSpeed needs.
"""

import json
from pathlib import Path

import pytest

from draftkit.config import describe_keys
from draftkit.distill.args import DistillArgs
from draftkit.distill.command import check_config, distill, load_config
from draftkit.distill.config import DistillConfig
from draftkit.distill.distributed import check_deepspeed_json
from draftkit.errors import ConfigError

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
YAMLS = sorted(p for p in RECIPES.rglob("*.yaml") if p.parent.name != "data")
JSONS = sorted((RECIPES / "deepspeed").glob("*.json"))


def test_recipes_exist():
    assert YAMLS, "no recipes found"
    assert any("quickstart" in p.name for p in YAMLS), "the quickstart recipe is missing"
    assert {p.name for p in JSONS} >= {"zero1.json", "zero2.json", "zero3.json"}


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: str(p.relative_to(RECIPES)))
def test_recipe_validates(path, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # relative paths must also resolve next to the recipe
    text = path.read_text()
    assert text.startswith("#"), "a recipe starts with a comment holding its launch command"
    assert "draftkit distill" in text.split("\n\n")[0] or "-m draftkit distill" in text \
        or "--module draftkit distill" in text, "the header must show the launch command"
    assert "/" in str(path.relative_to(RECIPES)) and "_to_" in path.parent.name, \
        "recipes are named <target>_to_<draft>/<method>.yaml"
    cfg = load_config(path)
    check_config(cfg, str(path))


@pytest.mark.parametrize("path", JSONS, ids=lambda p: p.name)
def test_deepspeed_json(path):
    ds = check_deepspeed_json(path)
    assert int(path.stem[-1]) == ds["zero_optimization"]["stage"]


def test_dry_run_prints_and_trains_nothing(capsys, tmp_path):
    recipe = next(p for p in YAMLS if "quickstart" in p.name)
    out = tmp_path / "run"
    assert distill(DistillArgs(recipe=str(recipe), overrides=[f"out_dir={out}"],
                               dry_run=True)) is None
    assert "is valid" in capsys.readouterr().out
    assert not out.exists()


def test_quickstart_distills_its_recipe_and_can_start_over(tmp_path):
    """The quickstart's settings on its recipe; --no-resume is resume=false, which the
    trainer's resume errors name for quickstart users."""
    import argparse

    from draftkit.config import add_arguments, from_namespace
    from draftkit.distill.checkpoint import QUICKSTART_FRESH
    from draftkit.quickstart import distill_config
    from draftkit.quickstart_args import QuickstartArgs

    def parse_args(cls, argv):
        parser = argparse.ArgumentParser()
        add_arguments(parser, cls)
        return from_namespace(cls, parser.parse_args(argv))

    recipe = next(p for p in YAMLS if "quickstart" in p.name)
    files = [tmp_path / "code.jsonl", tmp_path / "math.jsonl", tmp_path / "text.jsonl"]
    for f in files:
        f.write_text('{"prompt": "hi", "domain": "code"}\n')
    (tmp_path / "init").mkdir()
    for args, resume in ((parse_args(QuickstartArgs, []), True),
                         (parse_args(QuickstartArgs, ["--no-resume", "--minutes", "3"]), False)):
        cfg = distill_config(args, recipe, tmp_path / "q", tmp_path / "init", files, "g")
        assert cfg.resume is resume and cfg.draft.model == str(tmp_path / "init")
        assert cfg.out_dir == str(tmp_path / "q" / "distill") and cfg.max_minutes == args.minutes
        assert [s.max_rows for s in cfg.data.sources] == [args.prompts_per_domain] * 2 + [None]
        assert cfg.data.sources[-1].domain == "code"
    assert "--no-resume" in QUICKSTART_FRESH


def _recipe(tmp_path, text):
    path = tmp_path / "r.yaml"
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello world", "domain": "code"}\n')
    csv = tmp_path / "d.csv"
    csv.write_text("text,domain\nhello world,code\n")
    path.write_text(text.replace("DATA", str(data)).replace("CSV", str(csv)))
    return path


@pytest.mark.parametrize("text,expect", [
    ("max_step: 3\ndata: {sources: [{path: DATA}]}\n", "unknown key 'max_step'"),
    ("max_steps: three\ndata: {sources: [{path: DATA}]}\n", "key 'max_steps' expects int"),
    ("data: {sources: [{path: DATA, domian: x}]}\n", "unknown key 'data.sources.domian'"),
    ("data: {sources: [{path: missing.jsonl}]}\n", "missing.jsonl' does not exist"),
    ("data: {sources: [{path: data/Rows.JSONL.zst}]}\n", "Rows.JSONL.zst' does not exist"),
    ("data: {sources: []}\n", "data.sources is empty"),
    ("data: {sources: [{path: DATA}]}\nloss: {divergence: jsd, beta: 1.0}\n", "loss.beta"),
    ("data: {sources: [{path: DATA}]}\ntrain: {deepspeed: nope.json}\n", "nope.json"),
    ("data: {sources: [{path: DATA}]}\ndraft: {model: /no/such/dir}\n", "draft.model"),
    ("data: {sources: [{path: DATA}], generate: {extra_samples: 1, extra_temperature: 0}}\n",
     "extra_temperature must be > 0"),
    ("data: {sources: [{path: DATA, name: main}]}\n",
     "data.sources[0]: DATA: name 'main' picks a hub dataset's config"),
    ("data: {sources: [{path: CSV}]}\n", "data.sources[0]: cannot tell the format of CSV"),
    ("data: {sources: [{path: DATA}]}\ndraft: {derive_layers: []}\n",
     "draft.derive_layers names no layer"),
    ("data: {sources: [{path: DATA}]}\ndraft: {derive_layers: [0, 1, 0]}\n",
     r"draft.derive_layers 0,1,0: layer 0 is given twice"),
    ("data: {sources: [{path: DATA}]}\ndraft: {derive_layers: [-1, 0]}\n",
     r"draft.derive_layers -1,0: layer indices count from 0"),
    ("max_steps: 3\nmax_steps: 9\ndata: {sources: [{path: DATA}]}\n",
     "line 2: key 'max_steps' is given twice; keep one"),
    ("data: {sources: [{path: DATA}], regime: on_policy}\n", "never draws on-policy rows"),
    ("data: {sources: [{path: DATA}], generate: {extra_samples: 2}}\n",
     "regime 'fixed' does not generate"),
    ("data: {sources: [{path: DATA}], regime: target, seq_len: 48, "
     "generate: {max_new_tokens: 64}}\n", "leaves no room for the prompt in data.seq_len=48"),
    ("data: {sources: [{path: DATA}]}\ndraft: {num_layers: 0}\n",
     "key 'draft.num_layers' must be >= 1, got 0"),
])
def test_bad_recipes_name_key_and_file(tmp_path, text, expect):
    path = _recipe(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        check_config(load_config(path), str(path))
    assert expect.replace("DATA", str(tmp_path / "d.jsonl")).replace(
        "CSV", str(tmp_path / "d.csv")) in str(e.value)
    if "does not exist" not in expect:
        assert str(path) in str(e.value)


def test_dry_run_checks_seq_len_against_a_local_target(tmp_path, tiny_dirs):
    context = json.loads((tiny_dirs[0] / "config.json").read_text())["max_position_embeddings"]
    path = _recipe(tmp_path, f"target: {tiny_dirs[0]}\ndata: {{sources: [{{path: DATA}}], "
                             f"seq_len: {context + 1}}}\n")
    with pytest.raises(ConfigError, match=f"target: data.seq_len={context + 1} is longer than "
                                          f"the target's context window \\({context}\\)"):
        check_config(load_config(path), str(path))


def test_dry_run_checks_what_it_can_without_weights(tmp_path, tiny_dirs):
    """A dry run once said "valid" for runs that then failed: a draft whose tokenizer is not
    the target's, a data file that does not parse, a row of no known shape."""
    from tests.helpers import make_llama, make_tokenizer, save_model

    target = tiny_dirs[0]
    other = make_tokenizer(extra_words=("zebra",))
    foreign = save_model(make_llama(len(other), num_layers=1), other, tmp_path / "foreign")
    path = _recipe(tmp_path, f"target: {target}\ndraft: {{model: {foreign}}}\n"
                             f"data: {{sources: [{{path: DATA}}]}}\n")
    with pytest.raises(ConfigError, match=r"r.yaml: draft.model: draft vocab_size \d+ differs"):
        check_config(load_config(path), str(path))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "fine", "domain": "code"}\n{"text": "cut off\n')
    path = _recipe(tmp_path, f"target: {target}\ndata: {{sources: [{{path: {broken}}}]}}\n")
    with pytest.raises(ConfigError, match=r"r.yaml: data.sources\[0\]: cannot read .*broken"):
        check_config(load_config(path), str(path))
    shapeless = tmp_path / "shapeless.jsonl"
    shapeless.write_text('{"question": "2+2?", "domain": "math"}\n')
    path = _recipe(tmp_path, f"target: {target}\ndata: {{sources: [{{path: {shapeless}}}]}}\n")
    with pytest.raises(ConfigError, match=r"data.sources\[0\]: shapeless.jsonl:1: the row is "
                                          r"in none of the shapes draftkit reads"):
        check_config(load_config(path), str(path))


@pytest.mark.embedded
def test_dry_run_checks_seq_len_against_the_embedded_target(tmp_path):
    """Its config comes from the conversion or the GGUF file's metadata, no weights loaded."""
    path = _recipe(tmp_path, "target: embedded\ndata: {sources: [{path: DATA}], "
                             "seq_len: 9000}\n")
    with pytest.raises(ConfigError, match=r"target: data.seq_len=9000 is longer than the "
                                          r"target's context window \(8192\)"):
        check_config(load_config(path), str(path))


def test_recipe_files_that_are_not_recipes(tmp_path):
    with pytest.raises(ConfigError, match="is a folder; pass one of its YAML files"):
        load_config(tmp_path)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"# caf\xe9\nmax_steps: 3\n")
    with pytest.raises(ConfigError, match="latin.yaml is not UTF-8 text; save it as UTF-8"):
        load_config(latin)


def test_override_typo_names_key(tmp_path):
    path = _recipe(tmp_path, "data: {sources: [{path: DATA}]}\n")
    with pytest.raises(ConfigError, match="unknown key 'train.lrr'"):
        load_config(path, ["train.lrr=1"])
    assert load_config(path, ["train.lr=0.01", "max_steps=5"]).train.lr == 0.01


def test_switching_the_draft_source_on_the_command_line_says_how():
    """Overrides add to the recipe's draft section, so the recipe's way needs a null."""
    recipe = RECIPES / "smollm2-135m-instruct_to_4layer" / "fkl_topk_cpu.yaml"
    with pytest.raises(ConfigError, match=r"draft.model and draft.derive_layers are set: set "
                                          r"all but one to null \(e.g. draft.derive_layers=null"):
        load_config(recipe, ["draft={model: some/draft}"])
    cfg = load_config(recipe, ["draft={model: some/draft, derive_layers: null}"])
    assert (cfg.draft.model, cfg.draft.derive_layers, cfg.draft.draft_vocab_size) == (
        "some/draft", None, 4096)  # the section's other keys stay


def test_the_old_name_of_draft_vocab_size_still_loads_and_says_the_new_one(tmp_path, capsys):
    """draft.vocab_size was renamed draft.draft_vocab_size (N, not the vocabulary's V): a
    recipe or override that says the old name loads the same, with one line naming the new."""
    path = _recipe(tmp_path, "data: {sources: [{path: DATA}]}\n"
                             "draft: {derive_layers: [0], vocab_size: 64}\n")
    cfg = load_config(path)
    assert cfg.draft.draft_vocab_size == 64 and not hasattr(cfg.draft, "vocab_size")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "draft.vocab_size is deprecated" in err \
        and "draft.draft_vocab_size" in err
    # an override replaces the recipe's value, whichever name either of them says
    assert load_config(path, ["draft.draft_vocab_size=32"]).draft.draft_vocab_size == 32
    assert load_config(path, ["draft.vocab_size=16"]).draft.draft_vocab_size == 16
    recipe = RECIPES / "smollm2-135m-instruct_to_4layer" / "fkl_topk_cpu.yaml"  # the new name
    capsys.readouterr()
    assert load_config(recipe, ["draft.vocab_size=512"]).draft.draft_vocab_size == 512
    assert "draft.vocab_size is deprecated; it is now draft.draft_vocab_size" in \
        capsys.readouterr().err
    # a key of neither name is still an error naming the key (and the file)
    with pytest.raises(ConfigError, match="unknown key 'draft.vocab_sise'"):
        load_config(path, ["draft.vocab_sise=32"])
    path = _recipe(tmp_path, "data: {sources: [{path: DATA}]}\n"
                             "draft: {derive_layers: [0], head_size: 64}\n")
    with pytest.raises(ConfigError, match=f"{path}: unknown key 'draft.head_size'"):
        load_config(path)


def test_bad_deepspeed_json(tmp_path):
    p = tmp_path / "ds.json"
    p.write_text('{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 1}')
    with pytest.raises(ConfigError, match="zero_optimization"):
        check_deepspeed_json(p)
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        check_deepspeed_json(p)


def test_a_check_an_override_breaks_names_the_command_line(tmp_path):
    """The recipe alone passes its checks: the override that breaks one is the command line's
    fault, not the file's; a recipe that fails on its own is still the file's."""
    path = _recipe(tmp_path, "data: {sources: [{path: DATA}]}\n")
    for override, said in (("data.lmbda=0.5", "data.lmbda > 0 needs data.regime: on_policy"),
                           ("draft.derive_layers=[0,0]", "layer 0 is given twice")):
        with pytest.raises(ConfigError, match=f"^command line: .*{said}"):
            load_config(path, [override])
    bad = _recipe(tmp_path, "data: {sources: [{path: DATA}], lmbda: 0.5}\n")
    with pytest.raises(ConfigError, match=f"^{bad}: data.lmbda > 0 needs"):
        load_config(bad, ["seed=1"])


_DATA = "data: {sources: [{path: DATA}]}\n"


@pytest.mark.parametrize("text,key,said", [
    (_DATA + "train: {lr: 0}\n", "train.lr", "must be > 0, got 0.0"),
    ("data: {sources: [{path: DATA}], lmbda: 1.5}\n", "data.lmbda", "must be in [0, 1], got 1.5"),
    (_DATA + "draft: {ttt_decay: 0}\n", "draft.ttt_decay", "must be in (0, 1], got 0.0"),
    (_DATA + "train: {betas: [0.9, 1.0]}\n", "train.betas", "must be in [0, 1), got 1.0"),
    (_DATA + "max_minutes: 0\n", "max_minutes", "must be > 0, got 0.0"),
    ("data: {sources: [{path: DATA, repeat: 0}]}\n", "data.sources.repeat",
     "must be >= 1, got 0"),
])
def test_a_number_out_of_its_keys_bounds_names_the_key_and_the_file(tmp_path, text, key, said):
    """A single key's bounds ride on its type (fields.Range): one line naming key and file."""
    path = _recipe(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == f"{path}: key '{key}' {said}"


@pytest.mark.parametrize("override,said", [
    ("train.lr=0", "key 'train.lr' must be > 0, got 0.0"),
    ("data.lmbda=1.5", "key 'data.lmbda' must be in [0, 1], got 1.5"),
    ("draft.ttt_decay=0", "key 'draft.ttt_decay' must be in (0, 1], got 0.0"),
    ("draft.ttt_steps=0", "key 'draft.ttt_steps' must be >= 1, got 0"),
])
def test_an_override_out_of_its_keys_bounds_names_the_command_line(tmp_path, override, said):
    with pytest.raises(ConfigError) as e:
        load_config(_recipe(tmp_path, _DATA), [override])
    assert str(e.value) == f"command line: {said}"


def test_the_recipe_help_shows_each_keys_bounds():
    heads = [entry.split("\n")[0] for entry in describe_keys(DistillConfig)]
    for head in ("train.lr = 0.0003 (float > 0)", "data.lmbda = 0.0 (float in [0, 1])",
                 "draft.ttt_decay = null (float in (0, 1] or null)",
                 "train.betas = [0.9, 0.95] (list of float in [0, 1))"):
        assert head in heads


def test_the_default_quickstart_trains_an_eagle3_head_on_its_recipes_own_data(tmp_path):
    """The default quickstart recipe is an EAGLE-3 head's: head_config keeps its data and head
    and sets the budget, the output folder and resume; the eval shows the trained domains and
    two it was not trained on."""
    from draftkit.quickstart import UNTRAINED_SHOWN, head_config
    from draftkit.quickstart_args import RECIPE, QuickstartArgs

    recipe = RECIPES / RECIPE
    own = load_config(recipe)
    assert own.draft.kind == "eagle3"
    cfg = head_config(QuickstartArgs(minutes=2.5, resume=False), recipe, tmp_path, "g")
    assert cfg.draft == own.draft and cfg.data.sources == own.data.sources
    assert cfg.max_minutes == 2.5 and cfg.resume is False
    assert cfg.out_dir == str(tmp_path / "distill")
    # fixed work: by default the recipe's steps and no time budget, the same head anywhere
    default = head_config(QuickstartArgs(), recipe, tmp_path, "g")
    assert own.max_minutes is None and default.max_minutes is None
    assert default.max_steps == own.max_steps == cfg.max_steps
    trained = {s.domain for s in cfg.data.sources}
    assert trained == {"code", "math"} and not trained & set(UNTRAINED_SHOWN)
    check_config(cfg, str(recipe))


def test_the_eagle3_cpu_recipe_reads_the_4layer_recipes_data_and_held_out_rows():
    """The two CPU recipes are compared side by side (eval/results, row 19): the same sources,
    held-out rows, target answers and teacher, so only the draft differs."""
    head = load_config(RECIPES / "smollm2-135m-instruct_to_eagle3" / "ttt_cpu.yaml")
    standalone = load_config(RECIPES / "smollm2-135m-instruct_to_4layer"
                             / "fkl_topk_cpu_more_prompts.yaml")
    assert head.draft.kind == "eagle3" and standalone.draft.kind != "eagle3"
    for part in ("data", "teacher", "loss", "seed", "target"):
        assert getattr(head, part) == getattr(standalone, part), part
