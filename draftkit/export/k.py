"""The K (num_speculative_tokens) a bundle records for the engines' configs.

vLLM and SGLang draft a fixed K (vLLM also a K per batch size, from the report's batch sweep),
never one chosen each round, so export's ``--k`` is a number or where to take one from
(:data:`REPORT`), and ``auto`` is refused in one line, by :func:`check_export_k`, once, where
:func:`~draftkit.export.bundle.export_bundle` is entered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, Union

from draftkit.decode.k import AUTO, DEFAULT_FIXED_K, parse_k
from draftkit.errors import ConfigError
from draftkit.fields import Parsed

if TYPE_CHECKING:
    from draftkit.figures import EvalReport


REPORT = "report"  # the K the eval report's decodes used most (DEFAULT_FIXED_K without one)
# 'auto' parses (every command's --k knows the word) so that check_export_k can say why not
ExportKValue = Union[int, Literal["report", "auto"]]


def parse_export_k(value) -> ExportKValue:
    """``'report'`` (any case), ``'auto'`` or an integer >= 0."""
    if isinstance(value, str) and value.strip().lower() == REPORT:
        return REPORT
    return parse_k(value)


def check_export_k(value) -> int | str:
    """``value`` parsed: an integer or :data:`REPORT`; ``'auto'`` refused in one line."""
    k = parse_export_k(value)
    if k == AUTO:
        raise ConfigError(f"--k auto is not a K a bundle can record: vLLM and SGLang draft the "
                          f"fixed K the bundle's configs give them, none chosen each round "
                          f"(`draftkit serve BUNDLE --k auto` chooses one each round); pass --k "
                          f"{REPORT} (the K the report's decodes used most, else "
                          f"{DEFAULT_FIXED_K}) or an integer >= 0")
    return k


# The type of export's ``k``: the config layer reads it with parse_export_k.
ExportK = Annotated[ExportKValue, Parsed(parse_export_k, f"an integer >= 0 or '{REPORT}'")]


def recommended_k(k: int | str, report: "EvalReport | None") -> tuple[int, str]:
    """The K the bundle records, and where it came from (the manifest's ``k_source``)."""
    if k != REPORT:
        return k, "flag"
    overall = report.overall if report is not None else None
    if overall is not None and isinstance(overall.k, int):
        return overall.k, "report"
    return DEFAULT_FIXED_K, "default"
