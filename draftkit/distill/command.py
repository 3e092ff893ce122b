"""``draftkit distill RECIPE.yaml [key=value ...] [--dry-run | --prepare]``

Examples::

    draftkit distill recipes/smollm2-135m-instruct_to_4layer/fkl_topk_cpu.yaml
    draftkit distill recipes/smollm2-135m-instruct_to_4layer/ce_control_cpu.yaml seed=1
    draftkit distill recipes/llama3.1-8b-instruct_to_llama3.2-1b-instruct/fkl_zero2.yaml --dry-run

``--dry-run`` parses and type-checks the recipe, checks that the files it names exist and
that model specs resolve where that is cheap (local folders, the embedded model; hub ids are
checked for form only), and trains nothing. ``--prepare`` builds the target's answers and the
top-k teacher cache (for an eagle3 head also the cache of the target's features), which later
runs of the recipe read, and trains nothing.

Relative paths in a recipe are looked up in the current directory first, then next to the
recipe file, so a recipe runs from the repository root or from anywhere else.
"""

from __future__ import annotations

import dataclasses
import glob
import re
from pathlib import Path

from transformers import AutoConfig

from draftkit.config import load_recipe
from draftkit.data.sources import load_rows, source_format, to_example
from draftkit.distill.args import DistillArgs
from draftkit.distill.config import DistillConfig
from draftkit.distill.distributed import zero_stage
from draftkit.distill.draft import check_context
from draftkit.distill.eagle3 import check_target
from draftkit.distill.sizing import size_job, size_lines, target_facts
from draftkit.distill.trainer import prepare, train
from draftkit.errors import ConfigError, DraftkitError, ModelError
from draftkit.models import check_compatible, load_tokenizer, resolve_model
from draftkit.models.compat import check_eagle3
from draftkit.models.eagle3_layouts import head_config
from draftkit.models.embedded import embedded_config_and_tokenizer
from draftkit.resources import packaged_recipe

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
# a path ending in one of these is a file, never a hub id (compared in lower case)
_FILE_EXT = (".jsonl", ".json", ".parquet", ".txt", ".text", ".csv", ".gz", ".bz2", ".xz",
             ".zst")


def load_config(recipe: str | Path, overrides: list[str] | None = None) -> DistillConfig:
    """Parse a recipe with overrides and make its relative paths absolute. A recipe that is not
    a file here is looked up among the packaged ones (``smollm2-135m-instruct_to_eagle3/
    quickstart_ttt.yaml``, as under recipes/), so an installed draftkit runs them too."""
    if not Path(recipe).exists():
        recipe = packaged_recipe(str(recipe)) or recipe
    cfg = load_recipe(DistillConfig, recipe, overrides)
    return resolve_paths(cfg, Path(recipe).resolve().parent, str(recipe))


def _local(path: str, recipe_dir: Path) -> Path | None:
    """A relative path from the current directory, else from the recipe's folder."""
    p = Path(path).expanduser()
    candidates = [p] if p.is_absolute() else [Path.cwd() / p, recipe_dir / p]
    for c in candidates:
        if c.exists() or glob.glob(str(c)):
            return c.resolve() if c.exists() else c
    return None


def is_hub_id(path: str) -> bool:
    return bool(_HUB_ID.match(path)) and not path.lower().endswith(_FILE_EXT)


def resolve_paths(cfg: DistillConfig, recipe_dir: Path, source: str) -> DistillConfig:
    """Return ``cfg`` with data files, DeepSpeed config and local model folders made absolute.

    A file that must exist and does not is a ConfigError naming the key and the recipe.
    """
    sources = []
    for i, src in enumerate(cfg.data.sources):
        if src.format == "hub" or (src.format == "auto" and is_hub_id(src.path)
                                   and _local(src.path, recipe_dir) is None):
            sources.append(dataclasses.replace(src, format="hub"))
            continue
        found = _local(src.path, recipe_dir)
        if found is None:
            raise ConfigError(f"{source}: data.sources[{i}].path '{src.path}' does not exist "
                              f"(looked in {Path.cwd()} and {recipe_dir}); for a hub dataset "
                              f"give its org/name id or set format: hub")
        sources.append(dataclasses.replace(src, path=str(found)))
    data = dataclasses.replace(cfg.data, sources=sources)
    train = cfg.train
    if train.deepspeed:
        found = _local(train.deepspeed, recipe_dir)
        if found is None:
            raise ConfigError(f"{source}: train.deepspeed '{train.deepspeed}' does not exist")
        train = dataclasses.replace(train, deepspeed=str(found))
    draft = cfg.draft
    if draft.model and not _looks_remote(draft.model):
        found = _local(draft.model, recipe_dir)
        if found is None:
            raise ConfigError(f"{source}: draft.model '{draft.model}' does not exist")
        draft = dataclasses.replace(draft, model=str(found))
    target = cfg.target
    if not _looks_remote(target):
        found = _local(target, recipe_dir)
        if found is None:
            raise ConfigError(f"{source}: target '{target}' does not exist; pass a model "
                              f"folder, a hub id (org/name) or 'embedded'")
        target = str(found)
    return dataclasses.replace(cfg, data=data, train=train, draft=draft, target=target)


def _looks_remote(spec: str) -> bool:
    """'embedded' and hub ids are resolved by draftkit.models, not as paths."""
    return spec == "embedded" or (bool(_HUB_ID.match(spec)) and not Path(spec).exists())


def check_config(cfg: DistillConfig, source: str) -> list[str]:
    """The checks of ``--dry-run``: everything that can be checked without loading weights
    (each model's config and tokenizer: the context against ``data.seq_len``, a draft's
    tokenizer against the target's, an EAGLE-3 head's target; the first rows of each local
    data source). Returns notes on what was not checked."""
    notes = []
    zero_stage(cfg)  # checks the DeepSpeed JSON and what ZeRO-3 rules out
    found = {}  # role -> (config, tokenizer)
    for role, spec in (("target", cfg.target), ("draft", cfg.draft.model)):
        if spec is None:
            continue
        if _HUB_ID.match(spec) and not Path(spec).exists() and spec != "embedded":
            notes.append(f"{role} '{spec}' is a hub id: resolved when the run starts")
            continue
        try:
            if role == "draft" and cfg.draft.kind == "eagle3":  # a head to warm-start from
                if "target" not in found:
                    notes.append(f"the head '{spec}' is checked against the target when the "
                                 f"run starts")
                    continue
                _check_head(spec, found["target"][0])
                continue
            found[role] = config, _ = _config_and_tokenizer(spec, role)
            check_context(config, cfg.data.seq_len, role)
            if role == "target" and cfg.draft.kind == "eagle3":
                check_target(cfg, config)
        except (DraftkitError, ValueError, OSError) as e:  # ModelError is a DraftkitError
            raise ConfigError(f"{source}: {role}: {e}") from None
    if len(found) == 2:
        (t_cfg, t_tok), (d_cfg, d_tok) = found["target"], found["draft"]
        try:
            check_compatible(t_tok, d_tok, t_cfg, d_cfg)
        except ModelError as e:
            raise ConfigError(f"{source}: draft.model: {e}") from None
    return notes + _check_sources(cfg, source)


def _check_head(spec: str, target_config) -> None:
    """An eagle3 recipe's ``draft.model``: an EAGLE-3 head, in a layout draftkit reads, that
    reads this target's vocabulary, hidden size and layers. A head has no tokenizer of its own
    (it drafts the target's tokens), so none is looked for."""
    check_eagle3(target_config, head_config(resolve_model(spec, "draft").path, target_config))


def _config_and_tokenizer(spec: str, role: str):
    """A model's config and tokenizer, its weights neither loaded nor converted."""
    if spec == "embedded":
        return embedded_config_and_tokenizer()
    ref = resolve_model(spec, role)
    return AutoConfig.from_pretrained(ref.path), load_tokenizer(ref, role)


# rows of each local source a dry run reads: enough to meet a file's shape and encoding
DRY_RUN_ROWS = 20


def _check_sources(cfg: DistillConfig, source: str) -> list[str]:
    """Each data source's format, and the first rows of each local one read as training will
    read them (a file that does not parse, a row of no known shape: one line naming it)."""
    notes = []
    for i, src in enumerate(cfg.data.sources):
        where = f"{source}: data.sources[{i}]"
        try:
            fmt = source_format(src)
            if fmt == "hub":
                notes.append(f"dataset '{src.path}' is a hub id: loaded when the run starts")
                continue
            for origin, row in load_rows(src, fmt)[:DRY_RUN_ROWS]:
                to_example(row, src.domain, origin, src.shape)
        except DraftkitError as e:
            raise ConfigError(f"{where}: {e}") from None
    return notes


def distill(args: DistillArgs):
    """``draftkit distill``: validate the recipe, then train (unless ``--dry-run``)."""
    cfg = load_config(args.recipe, args.overrides)
    notes = check_config(cfg, args.recipe)
    if args.dry_run:
        sources = ", ".join(f"{Path(s.path).name}" + (f" ({s.domain})" if s.domain else "")
                            for s in cfg.data.sources)
        d = cfg.draft
        layers = d.aux_layers or "[2, L // 2, L - 3]"
        start = (f"started from {d.model} (its layers and vocabulary)" if d.model else
                 f"over {d.draft_vocab_size} tokens reading layers {layers}")
        depth = f"of {d.num_layers} layers " if (d.num_layers or 1) > 1 else ""
        head = "" if d.kind != "eagle3" else (
            f", {'a parallel (P-EAGLE)' if d.parallel else 'an'} EAGLE-3 head {depth}{start}, "
            f"{d.steps} training-time-test steps weighted {d.decay:g}^i")
        print(f"recipe {args.recipe} is valid: target {cfg.target}{head}, {cfg.max_steps} "
              f"steps of {cfg.train.batch_size}x{cfg.train.grad_accum}x{cfg.data.seq_len} "
              f"tokens, {cfg.loss.divergence} at temperature {cfg.loss.temperature}, teacher "
              f"{cfg.teacher.mode}, data {cfg.data.regime}: {sources}")
        for line in size_lines(size_job(cfg, *target_facts(cfg.target))):
            print(f"  {line}")
        for note in notes:
            print(f"  note: {note}")
        return None
    if args.prepare:
        built = prepare(cfg)
        caches = "".join(f"; {what.replace('_', ' ')} in {built[what]}"
                         for what in ("teacher_cache", "feature_cache") if built[what])
        print(f"prepared {built['rows']} training rows and {built['heldout_rows']} held-out "
              f"rows{caches}; train with: draftkit distill {args.recipe}"
              + "".join(f" {o}" for o in args.overrides))
        return None

    return train(cfg)
