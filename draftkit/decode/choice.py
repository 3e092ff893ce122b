"""How a K given becomes each round's K: a fixed K, the ``auto`` policy, or K = 0 without a
draft.

This module sits above both :mod:`draftkit.decode.k` (the type, its parser and bounds) and
:mod:`draftkit.decode.policy` (what ``auto`` chooses with), so neither imports the other's
user. A K is validated once, where it enters: a command's arguments (``validate``), or
:func:`resolve_k` for a caller of the library; everything after takes the :class:`KChoice`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from draftkit.decode.k import AUTO, K_MAX, KValue, check_k
from draftkit.decode.policy import KPolicy

if TYPE_CHECKING:
    from draftkit.decode.stats import RoundStats


@dataclass(frozen=True)
class KChoice:
    """How each round's K is chosen: ``fixed``, or by ``policy``. ``k_max`` is the most any
    round drafts (the room each row keeps free for a round: see ``round_margin``)."""

    k_max: int
    fixed: int | None = None
    policy: KPolicy | None = None

    @classmethod
    def of(cls, k: KValue, k_max: int = K_MAX, *, has_draft: bool,
           policy: KPolicy | None = None) -> KChoice:
        """The choice for an already validated K (a command's, after its ``validate``).

        No draft: K = 0, whatever was asked. ``auto``: ``policy`` (one that has already
        learnt, e.g. across a domain's prompts) or a fresh KPolicy up to ``k_max``. A fixed K:
        that K, also the most a round drafts."""
        if not has_draft:
            return PLAIN
        if k == AUTO:
            policy = policy if policy is not None else KPolicy(k_max=k_max)
            return cls(k_max=policy.k_max, policy=policy)
        return cls(k_max=k, fixed=k)

    def choose(self, batch: int) -> int:
        """The K of the next round over ``batch`` live rows."""
        return self.fixed if self.policy is None else self.policy.choose(batch)

    def observe(self, r: RoundStats) -> None:
        """Tell the policy (if any) what the round cost and kept."""
        if self.policy is not None:
            self.policy.observe(r)

    @property
    def label(self) -> str:
        return AUTO if self.policy is not None else str(self.fixed)


PLAIN = KChoice(k_max=0, fixed=0)  # plain decoding: K = 0 every round


def resolve_k(k, k_max: int = K_MAX, *, has_draft: bool, policy: KPolicy | None = None,
              bounded: bool = False) -> KChoice:
    """What a decode with this K does each round, for a K not validated yet (a library
    caller's): ``k`` parsed and ``k_max`` checked (:func:`~draftkit.decode.k.check_k`; with
    ``bounded`` a fixed K above ``k_max`` is an error), then :meth:`KChoice.of`."""
    return KChoice.of(check_k(k, k_max, bounded=bounded), k_max, has_draft=has_draft,
                      policy=policy)
