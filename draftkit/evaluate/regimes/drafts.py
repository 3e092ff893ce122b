"""The drafts a regime map measures: the given draft, early exits of the target and drafts
distilled on one domain each.

Why early exits: a cut that keeps the target's last layer (``0,1,2,29``) accepts almost nothing
before it is trained (the last layer expects the residual stream of layer 28), while the first
N layers read by the final norm and head already agree with the target now and then.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from draftkit.errors import DraftkitError
from draftkit.evaluate.args import DEFAULT_DRAFT_LAYERS
from draftkit.figures import DraftInfo
from draftkit.models import load_another_draft, resolve_model
from draftkit.models.derive import derive_by_layers
from draftkit.models.facts import text_config


@dataclass
class Draft:
    name: str
    model: Any
    layers: int  # decoder layers
    main: bool = False  # the draft the entropy and batch regimes map
    derived: bool = False  # an early exit of the target (the draft-cost curve)
    home: str | None = None  # the domain a domain draft was distilled on

    def info(self) -> DraftInfo:
        """What the report says of this draft."""
        return DraftInfo.of(self)


def num_layers(model) -> int:
    return text_config(model).num_hidden_layers


def early_exit(target, n: int):
    """The target's first n layers, then its final norm and head (the target itself when n
    covers it: a draft with alpha = 1 and c ~ 1)."""
    total = num_layers(target)
    return target if n >= total else derive_by_layers(target, list(range(n)))


def build_drafts(pair, domains: list[str], layer_sizes: list[int],
                 drafts_by_domain: dict[str, str], device: str | None = None,
                 dtype: str = "auto") -> list[Draft]:
    """The pair's draft (if any), an early exit of the target for each of ``layer_sizes`` (and
    of DEFAULT_DRAFT_LAYERS, the main draft, when the pair has none) and each domain's draft."""
    total = num_layers(pair.target)
    drafts: list[Draft] = []
    if pair.draft is not None:
        drafts.append(Draft(pair.draft_ref.name, pair.draft, num_layers(pair.draft), main=True))
    for n in sorted({min(n, total) for n in layer_sizes}
                    | (set() if pair.draft is not None else {min(DEFAULT_DRAFT_LAYERS, total)})):
        name = f"target itself ({n} layers)" if n == total else f"first {n} layers"
        drafts.append(Draft(name, early_exit(pair.target, n), n, derived=True,
                            main=pair.draft is None and n == min(DEFAULT_DRAFT_LAYERS, total)))
    for domain, path in drafts_by_domain.items():
        if domain not in domains:
            raise DraftkitError(f"--drafts-by-domain {domain}={path}: the suite has no domain "
                                f"{domain!r}; it has {', '.join(domains)}")
        model = load_another_draft(pair, path, device, dtype)
        drafts.append(Draft(f"{domain} draft ({resolve_model(path, 'draft').name})", model,
                            num_layers(model), home=domain))
    return drafts
