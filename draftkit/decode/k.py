"""K (num_speculative_tokens): its type, its bounds, and how a given K becomes each round's.

K is the number of tokens the draft proposes per round (Leviathan et al., arXiv 2211.17192):
an integer >= 0, where K = 0 is plain decoding, or ``"auto"``, chosen every round by
:class:`~draftkit.decode.policy.KPolicy` from measured acceptance and cost, up to ``k_max``.

- :data:`K` is the field type every command's ``--k`` has; the config layer reads YAML values,
  ``key=value`` overrides and flags through :func:`parse_k`.
- :func:`check_k` validates a K against ``k_max``; :func:`resolve_k` says how a K given becomes
  each round's (:class:`KChoice`: a fixed K, the policy, or K = 0 without a draft).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal, Union

from draftkit.config import Parsed
from draftkit.errors import ConfigError, DraftkitError

if TYPE_CHECKING:
    from draftkit.decode.policy import KPolicy
    from draftkit.decode.stats import RoundStats

AUTO = "auto"
# The largest K ``auto`` may choose unless told otherwise (each row keeps k_max + 2 positions
# free for a round: engine.round_margin).
K_MAX = 8
# The K of a command that needs a fixed one and is not given it: ``draftkit bench`` (HF
# assisted generation drafts a constant number) and the K ``draftkit export`` recommends when
# no eval report says otherwise.
DEFAULT_FIXED_K = 3

KValue = Union[int, Literal["auto"]]


def parse_k(value) -> KValue:
    """``'auto'`` (any case) or an integer >= 0, given as an int or its text."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    k = None
    if isinstance(value, int) and not isinstance(value, bool):
        k = int(value)  # a plain int, not YAML's int that keeps its text
    elif isinstance(value, str) and value.strip().lstrip("+").isdecimal():
        k = int(value)
    if k is None or k < 0:
        raise DraftkitError(f"K (num_speculative_tokens) must be an integer >= 0 or 'auto', "
                            f"got {value!r}")
    return k


# The type of every ``k`` field: the config layer reads it with parse_k.
K = Annotated[KValue, Parsed(parse_k, "an integer >= 0 or 'auto'")]


def check_k_max(k_max: int) -> None:
    if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 0:
        raise ConfigError(f"--k-max must be >= 0, got {k_max}")


def check_k(k, k_max: int = K_MAX, *, bounded: bool = False) -> KValue:
    """``k`` parsed, and ``k_max`` checked. ``k_max`` bounds what ``auto`` may choose; with
    ``bounded`` it bounds a fixed K too (eval: its predictions and K sweep stop at k_max)."""
    k = parse_k(k)
    check_k_max(k_max)
    if bounded and k != AUTO and k > k_max:
        raise ConfigError(f"--k {k} is above --k-max {k_max}; raise --k-max")
    return k


# --- how a K given becomes each round's ----------------------------------------------------

@dataclass(frozen=True)
class KChoice:
    """How each round's K is chosen: ``fixed``, or by ``policy``. ``k_max`` is the most any
    round drafts (the room each row keeps free for a round: see ``round_margin``)."""

    k_max: int
    fixed: int | None = None
    policy: KPolicy | None = None

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


def resolve_k(k, k_max: int = K_MAX, *, has_draft: bool, policy: KPolicy | None = None,
              bounded: bool = False) -> KChoice:
    """What a decode with this K does each round.

    No draft: K = 0, whatever was asked. ``auto``: ``policy`` (one that has already learnt,
    e.g. across a domain's prompts) or a fresh KPolicy up to ``k_max``. A fixed K: that K,
    also the most a round drafts (above ``k_max`` only an error with ``bounded``).
    """
    k = check_k(k, k_max, bounded=bounded)
    if not has_draft:
        return KChoice(k_max=0, fixed=0)
    if k == AUTO:
        if policy is None:
            from draftkit.decode.policy import KPolicy  # it reads this module's bounds

            policy = KPolicy(k_max=k_max)
        return KChoice(k_max=policy.k_max, policy=policy)
    return KChoice(k_max=k, fixed=k)
