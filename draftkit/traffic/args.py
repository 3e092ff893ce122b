"""The traffic commands' args: ``draftkit traffic``'s (:class:`TrafficArgs`), ``draftkit
import-traffic``'s (:class:`ImportArgs`) and ``draftkit refresh``'s (:class:`RefreshArgs`); the
commands are :mod:`draftkit.traffic.command`, :mod:`draftkit.traffic.logs` and
:mod:`draftkit.traffic.refresh`. Light to import (no torch, no numpy): ``draftkit COMMAND
--help`` reads them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from draftkit.config import option
from draftkit.decode.k import FixedK
from draftkit.errors import ConfigError
from draftkit.fields import Range
from draftkit.signing_args import SigningArgs, TrustArgs
from draftkit.traffic.shards import STRICT_HELP

MIN_REQUESTS = 20  # fewest requests a domain needs to be flagged (draftkit.traffic.drift)
FLEET = "a vLLM fleet's own counters"  # the --help group of --prometheus and its flags
MISSING, ALL, OFF = "missing", "all", "off"  # --replay
REPLAY_CHOICES = (MISSING, ALL, OFF)
TOP = 20  # domains the table shows by default; the rest fold into one row


@dataclass(kw_only=True)
class TrafficArgs(TrustArgs):
    """Served acceptance per domain from the traffic `draftkit serve --record DIR` kept:
    alpha_i, alpha, tau and the predicted speedup with 95% intervals over requests, beside the
    bundle's eval figures, each domain whose served alpha lies below its eval's flagged."""

    folder: str | None = option(None, help="the folder `draftkit serve --record DIR` wrote",
                                positional=True, metavar="DIR")
    bundle: str | None = option(None, help="the bundle that served the traffic: its eval "
                                           "figures and c; the traffic must have been recorded "
                                           "with its target and tokenizer")
    out: str | None = option(None, help="folder for report.json, report.md, report.html and "
                                        "the plot")
    min_requests: int = option(MIN_REQUESTS, help="fewest requests a domain needs to be "
                                                  "flagged; fewer are reported as too few")
    domain: str | None = option(None, help="only this domain label")
    top: int = option(TOP, help="rows for the largest domains by requests (and every flagged "
                                "one); the rest fold into one row, 'other (N labels)'")
    all: bool = option(False, help="a row for every domain label (no folding)")
    strict: bool = option(False, help=STRICT_HELP)
    replay: str = option(MISSING, choices=REPLAY_CHOICES, help="with --bundle, which requests' "
                         "acceptance to compute by replaying their completion through its "
                         "draft at its K: 'missing': those the engine reported no counts for "
                         "(n > 1, a vLLM server without per-request metrics, imported logs); "
                         "'all': every one (the engine's counts set aside); 'off': none")
    device: str | None = option(None, help="where the replay runs: cpu, cuda, cuda:1, ... "
                                           "(default: cuda if available)")
    prometheus: str | None = option(None, metavar="URL", group=FLEET, help="also read a "
                                    "running vLLM fleet's own vllm:spec_decode_* counters from "
                                    "this Prometheus server (its base URL): tau, alpha and "
                                    "alpha_i over the whole fleet, beside the bundle's eval")
    window: str | None = option(None, metavar="RANGE", group=FLEET, help="with --prometheus: "
                                "over this PromQL range (1h, 30m, 7d); default: the counters' "
                                "totals since each server started")
    selector: str = option("", metavar="MATCHERS", group=FLEET, help="with --prometheus: "
                           "PromQL label matchers picking the fleet, e.g. "
                           "'model_name=\"llama-8b\",job=\"vllm\"'")

    def validate(self) -> None:
        if self.min_requests < 1:
            raise ConfigError("--min-requests must be >= 1")
        if self.top < 1:
            raise ConfigError(f"--top must be >= 1, got {self.top}; --all shows every label")
        if self.folder is None and self.prometheus is None:
            raise ConfigError("give the traffic folder (DIR) `draftkit serve --record DIR` "
                              "wrote, or --prometheus URL, or both")
        if (self.window or self.selector) and self.prometheus is None:
            raise ConfigError("--window and --selector are for --prometheus")
        if self.window is not None and not re.fullmatch(r"[1-9][0-9]*(ms|s|m|h|d|w|y)",
                                                        self.window):
            raise ConfigError(f"--window {self.window!r} is not a PromQL range; give a "
                              f"number and a unit: 1h, 30m, 7d")
        if self.replay == ALL and self.bundle is None:
            raise ConfigError("--replay all replays through a bundle's draft: give --bundle")
        if self.domain is not None and self.folder is None:
            raise ConfigError("--domain picks a label of the recorded traffic: give its "
                              "folder (DIR)")


@dataclass
class ImportArgs:
    """Turn OpenAI-style request logs (request and answer per line, or the Batch API's input
    and output files) into a traffic folder `draftkit traffic` and `draftkit refresh` read:
    prompts rendered with the bundle target's chat template, answers tokenized, acceptance left
    for `draftkit traffic --bundle` to replay."""

    logs: list[str] = option(help="JSONL log files", positional=True, nargs="+", metavar="LOG")
    bundle: str = option(help="the bundle whose target answered: its tokenizer and chat "
                              "template render the prompts, its identities mark the records")
    into: str = option(metavar="DIR", help="the traffic folder to add the records to "
                                           "(created if missing; it must hold this target's "
                                           "traffic only)")
    domain: str | None = option(None, help="label for requests whose body names none "
                                           "(metadata.domain, user)")

    def validate(self) -> None:
        missing = [p for p in self.logs if not Path(p).is_file()]
        if missing:
            raise ConfigError(f"no log file {missing[0]}; give JSONL files of requests and "
                              f"their answers")


_Count = Annotated[int, Range(low=1)]


@dataclass(kw_only=True)
class RefreshArgs(SigningArgs, TrustArgs):
    """Retrain a bundle's draft on its recorded traffic; export it only where it is faster."""

    bundle: str = option(help="the bundle that served the traffic", positional=True)
    traffic: str = option(help="the folder `draftkit serve --record` wrote")
    out: str = option(help="where the new bundle goes (written only if it is faster)")
    overrides: list[str] = option([], help="key=value overrides of the bundle's recipe "
                                           "(train.lr=3e-4)", positional=True, nargs="*",
                                  metavar="KEY=VALUE")
    work: str | None = option(None, help="the training run, its data and the comparison "
                                         "(default: OUT.work beside --out)")
    steps: _Count = option(120, help="training steps (fixed work: the same draft on any machine)")
    minutes: Annotated[float, Range(above=0)] | None = option(
        None, help="also stop training after this many minutes")
    heldout: Annotated[float, Range(above=0, below=1, what="a share of the requests")] = option(
        0.25, help="share of each domain's most recent requests held out to compare the drafts "
                   "on")
    min_requests: Annotated[int, Range(low=2)] = option(
        8, help="requests a domain needs to be trained on")
    max_new_tokens: int = option(64, help="tokens per compared decode, at most (each held-out "
                                          "request decodes as many as it was served, up to this)")
    k: FixedK | None = option(None, help="K both drafts run in the comparison (default: the "
                                          "bundle's num_speculative_tokens)")
    replay: bool = option(True, help="train on the recipe's own data too (--no-replay: traffic "
                                     "only)")
    traffic_repeat: _Count = option(5, help="each traffic request is trained this many times an "
                                           "epoch beside the replayed rows once: the traffic is "
                                           "what the draft will serve, and it is the smaller set")
    on_policy: Annotated[float, Range(low=0, high=1, what="a share of the steps")] = option(
        0.0, help="share of training steps on-policy, drawn from the traffic's prompts (and "
                  "the replayed ones): an EAGLE-3 head drafts while the target decodes, the "
                  "drafts it rejected weighing the recipe's draft.rejection_weight; a "
                  "standalone draft answers alone, scored by the target; 0: none")
    keep_vocab: bool = option(False, help="an EAGLE-3 head keeps its draft vocabulary "
                                          "(default: chosen again at its size on the training "
                                          "rows; tokens it keeps keep their rows)")
    recipe: str | None = option(None, help="distillation recipe (default: the one the bundle "
                                           "records)")
    strict: bool = option(False, help=STRICT_HELP)
    device: str | None = option(None, help="device for training and the comparison")
