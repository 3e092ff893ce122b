"""K (num_speculative_tokens): its type, its bounds, and the check a K given gets once.

K is the number of tokens the draft proposes per round (Leviathan et al., arXiv 2211.17192):
an integer >= 0, where K = 0 is plain decoding, or ``"auto"``, chosen every round by
:class:`~draftkit.decode.policy.KPolicy` from measured acceptance and cost, up to ``k_max``.

- :data:`K` is the field type every command's ``--k`` has; the config layer reads YAML values,
  ``key=value`` overrides and flags through :func:`parse_k`.
- :data:`FixedK` is the type of a command's ``--k`` where the command needs one K for every
  round (``bench``: HF assisted generation drafts a constant number; ``regimes``: every draft
  measured at the same K; ``refresh``: both drafts compared at one): an integer >= 1, read
  through :func:`parse_fixed_k`, whose refusal names the flag in one line.
- :func:`check_k` validates a K against ``k_max``, once, where it enters (a command's
  ``validate``, or :func:`~draftkit.decode.choice.resolve_k` for a library caller);
  :mod:`draftkit.decode.choice` says how it becomes each round's K.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from draftkit.errors import ConfigError, DraftkitError
from draftkit.fields import Parsed

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

FIXED_K = "a fixed K (an integer >= 1)"


def parse_fixed_k(value) -> int:
    """An integer >= 1, given as an int or its text: a K that is the same every round."""
    try:
        k = parse_k(value)
    except DraftkitError:
        k = None
    if k is None or k == AUTO or k < 1:
        raise DraftkitError(f"K (num_speculative_tokens) must be {FIXED_K}, got {value!r}")
    return k


# The type of a ``k`` field whose command needs one K every round: read with parse_fixed_k.
FixedK = Annotated[int, Parsed(parse_fixed_k, FIXED_K)]


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
