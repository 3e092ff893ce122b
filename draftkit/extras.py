"""draftkit's optional parts and the extras that install them.

The core (decode, eval, export, check) needs torch, transformers and what they need; training
adds DeepSpeed, PEFT, W&B and datasets (``train``), the server its web stack (``serve``). A
command that reaches a missing part stops in one line naming the extra to install.
"""

from __future__ import annotations

import importlib.util

from draftkit.errors import DraftkitError

DISTRIBUTION = "draftkit-spec"  # the name on the package index; the import name is draftkit
EXTRAS = {
    "train": ("datasets", "peft", "deepspeed", "wandb"),
    "serve": ("fastapi", "uvicorn", "prometheus_client", "httpx"),
    "docs": ("mkdocs", "material"),  # the docs site (draftkit.labs.sitegen), built from a checkout
}


def missing(modules: tuple[str, ...]) -> list[str]:
    """Those of ``modules`` that are not installed (found without importing them)."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def require(extra: str, what: str, modules: tuple[str, ...] | None = None) -> None:
    """One DraftkitError line where ``modules`` (default: all of ``extra``'s) are not all
    installed: ``what`` needs them, and the extra that installs them."""
    lacking = missing(modules or EXTRAS[extra])
    if lacking:
        raise DraftkitError(f"{what} needs {', '.join(lacking)}, from draftkit's '{extra}' "
                            f"extra, which is not installed: pip install "
                            f"'{DISTRIBUTION}[{extra}]'")
