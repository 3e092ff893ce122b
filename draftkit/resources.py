"""The files draftkit's commands read at run time, shipped inside the package under
``draftkit/share/``: the eval suites and training prompts (``eval/suites``,
``eval/train_prompts``), the recipes (``recipes/``, with the data and DeepSpeed configs they
name) and the reference run's timing the quickstart scales its estimate from. In a checkout,
``draftkit/share/`` holds links to the repository's own folders, so they are the same files;
a wheel holds copies of them. Found through :mod:`importlib.resources`, wherever draftkit is
installed.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from draftkit.errors import DraftkitError

SHARE = "share"


def share_path(*parts: str) -> Path:
    """The path of ``share/PARTS...`` in the installed package, there or not."""
    return Path(str(files("draftkit").joinpath(SHARE, *parts)))


def shared(*parts: str) -> Path:
    """The path of ``share/PARTS...`` in the installed package, or one DraftkitError line
    where the install lacks it."""
    path = share_path(*parts)
    if not path.exists():
        raise DraftkitError(f"draftkit's {'/'.join(parts)} is missing from this install "
                            f"({path}); reinstall draftkit")
    return path


def packaged_recipe(name: str) -> Path | None:
    """The packaged recipe ``name`` (as under recipes/: ``smollm2-135m-instruct_to_eagle3/
    quickstart_ttt.yaml``, ``recipes/`` in front or not), or None where there is none."""
    path = share_path("recipes", *Path(name.removeprefix("recipes/")).parts)
    return path if path.is_file() else None


def packaged_recipes() -> list[str]:
    """The packaged recipes' names, as :func:`packaged_recipe` takes them."""
    root = shared("recipes")
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.yaml")
                  if p.parent != root / "deepspeed")
