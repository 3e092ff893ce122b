"""What an evaluation measures with: the decoding arguments and how much it measures, declared
once for ``draftkit eval``'s flags (:class:`draftkit.evaluate.args.EvalArgs` adds what to
measure and where to write it), the quickstart and the regime map, which build it directly."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from draftkit.config import option
from draftkit.decode.args import DecodingArgs
from draftkit.errors import ConfigError

GROUP = "measurement options"


@dataclass(kw_only=True)
class EvalSettings(DecodingArgs):
    """What the measurements decode with (K, sampling) and how much they measure."""

    k_bounded: ClassVar[bool] = True  # predictions and the K sweep stop at k_max

    max_new_tokens: int = option(128, group=GROUP, help="new tokens per prompt")
    repeats: int = option(1, group=GROUP, help="timing repeats (pooled with the prompts)")
    k_sweep: list[int] = option([1, 2, 4, 6], group=GROUP,
                                help="K values measured in the K sweep (empty to skip; "
                                     "predictions cover 1..k_max)")
    k_sweep_prompts: int = option(2, group=GROUP, help="prompts per domain the K sweep decodes "
                                                       "at each K (its first ones)")
    k_sweep_tokens: int = option(48, group=GROUP,
                                 help="new tokens per prompt in the K sweep; with "
                                      "--k-sweep-prompts equal to the table's, the sweep "
                                      "compares like for like with it")
    batch_sizes: list[int] = option([1, 2, 4, 8, 16], group=GROUP,
                                    help="batch sizes of the batch sweep (empty to skip); "
                                         "batch size 1 is the table's own measurement")
    batch_groups: int = option(4, group=GROUP,
                               help="batches of distinct prompts the batch sweep decodes at "
                                    "each batch size (fewer where the prompts run out), each "
                                    "plainly and with speculation: the speedup's interval "
                                    "resamples them; one batch gives no interval")
    batch_tokens: int | None = option(None, group=GROUP,
                                      help="new tokens per row in the batch sweep; default: "
                                           "--max-new-tokens, as the table's")

    @property
    def sweep_tokens(self) -> int:
        """New tokens per row in the batch sweep."""
        return self.batch_tokens or self.max_new_tokens

    def validate(self) -> None:
        super().validate()
        for name in ("max_new_tokens", "repeats", "k_sweep_prompts", "k_sweep_tokens",
                     "batch_groups", "batch_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1")
        if any(b < 1 for b in self.batch_sizes) or any(k < 1 for k in self.k_sweep):
            raise ConfigError("--batch-sizes and --k-sweep take positive integers")
