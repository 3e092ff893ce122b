"""``draftkit serve``'s args (:class:`ServeArgs`; the command is :mod:`draftkit.serve.command`).
Light to import (no torch, no web stack): ``draftkit serve --help`` reads them.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass

from draftkit.config import option, reuse
from draftkit.decode.args import SamplingArgs, SpeculationArgs
from draftkit.engines.args import CPU_FIX_CHOICES, CPU_FIX_HELP, PYTHON_HELP
from draftkit.errors import ConfigError
from draftkit.models.args import ModelArgs
from draftkit.traffic.record import LABEL_CHARS, UNLABELED, clean_label

ENGINE = "serving engine"  # the --help group of --engine and the vLLM front's flags

# Slots' caches are allocated up front: 16 x 8192 positions of a 30-layer model is ~6 GB in
# fp32, too much for a default on a CPU box; --max-model-len raises it.
DEFAULT_MAX_MODEL_LEN = 2048
RECORD = "recording served traffic"  # the --help group of --record and its flags
TOKEN_ENV = "DRAFTKIT_ADMIN_TOKEN"  # the token POST /admin/draft asks for, where no --admin-token


@dataclass
class ServeArgs(ModelArgs, SpeculationArgs):
    """Serve a bundle (or a target and draft) over an OpenAI-compatible HTTP API."""

    bundle: str | None = option(None, positional=True, help="bundle directory from `draftkit "
                                "export` (target and draft), or a plain model directory")
    target: str | None = reuse(ModelArgs, "target", None, note="; overrides the bundle's")
    # "" (not None) when unset: the config layer reads "none" as None, and "none" must stay
    # distinct from "take the bundle's"
    draft: str = reuse(ModelArgs, "draft", "", note="; overrides the bundle's; none = plain "
                       "decoding")
    verify: str = reuse(SamplingArgs, "verify", note=" (every sampled request; --engine vllm "
                        "verifies as the bundle's speculative config says)")
    host: str = option("127.0.0.1", help="address to listen on")
    port: int = option(8000, help="port to listen on")
    max_batch: int = option(16, help="slots: requests decoded together at most")
    max_model_len: int | None = option(None, help="positions per slot (prompt + output); "
                                                  f"default: the target's context window, at "
                                                  f"most {DEFAULT_MAX_MODEL_LEN} (the KV cache "
                                                  f"is allocated for max-batch x this)")
    max_tokens_limit: int = option(2048, help="largest max_tokens a request may ask for")
    max_body_bytes: int = option(1 << 20, help="largest request body accepted")
    served_model_name: str | None = option(None, help="model name in the API (default: the "
                                                      "bundle's folder name)")
    shutdown_timeout: int = option(30, help="seconds in-flight requests get to finish on "
                                            "SIGINT/SIGTERM")
    fast_path: bool = option(True, help="use the Llama-family fast path where it applies "
                                        "(--no-fast-path: general path, cohort batching)")
    log_level: str = option("info", help="uvicorn log level",
                            choices=("critical", "error", "warning", "info", "debug"))
    admin_token: str | None = option(None, metavar="TOKEN", help="turn on POST /admin/draft "
                                     "(swap in a new bundle's draft), authorized by "
                                     "'Authorization: Bearer TOKEN'; default: the environment's "
                                     "DRAFTKIT_ADMIN_TOKEN (safer: ps shows the flag); neither: "
                                     "the endpoint is off")
    record: str | None = option(None, metavar="DIR", group=RECORD, help="append each finished "
                                "request to traffic shards in DIR (token ids, sampling, each "
                                "round's K and accepted count, a domain label; no text, no "
                                "header), for `draftkit traffic`; a request opts out with "
                                "metadata {\"draftkit_record\": \"off\"}")
    record_shard_mb: float = option(64.0, group=RECORD, help="a shard is sealed (renamed "
                                    "traffic-*.jsonl, readable) once it passes this many MB")
    record_quota_mb: float = option(10240.0, group=RECORD, help="recording stops once DIR's "
                                    "shards reach this many MB; a full DIR is refused at start")
    record_retention_days: float | None = option(None, group=RECORD, help="delete DIR's sealed "
                                                 "shards older than this many days (at start "
                                                 "and as shards seal); default: keep them. "
                                                 "Recorded ids are users' prompts and answers")
    record_prompts: bool = option(True, group=RECORD, help="keep each request's prompt ids "
                                  "(--no-record-prompts: the completion and the engine's counts "
                                  "only, prompt_ids null, where a policy forbids keeping "
                                  "prompts; such records cannot be replayed by `draftkit "
                                  "traffic` nor trained on by `draftkit refresh`)")
    route_labels: list[str] = option([], metavar="LABEL,...", group=RECORD, help="serve the API "
                                     "under /LABEL/v1 too, for each label (code,math,chat): a "
                                     "request that comes by one is labelled with it unless its "
                                     "metadata.domain or user names a label")

    engine: str = option("draftkit", choices=("draftkit", "vllm"), group=ENGINE,
                         help="draftkit: decode in draftkit's own engine; vllm: start vLLM's "
                              "OpenAI server(s) with the bundle (its serving/vllm.sh command, "
                              "in vLLM's environment) and serve the same API in front of them: "
                              "recording, /metrics, /health and draft swaps (blue/green) as "
                              "with draftkit's engine")
    replicas: int = option(1, group=ENGINE, help="--engine vllm: vLLM servers to start; each "
                                                 "request goes to the least busy")
    tensor_parallel_size: int = option(1, group=ENGINE, help="--engine vllm: GPUs (CPU core "
                                       "groups on the CPU build) per replica")
    engine_args: str = option("", metavar="'FLAGS'", group=ENGINE, help="--engine vllm: vLLM's "
                              "own flags for every replica, quoted as one word: "
                              "'--max-num-seqs 64 --max-model-len 4096'")
    engine_python: str | None = option(None, group=ENGINE, help=PYTHON_HELP)
    vllm_cpu_fix: str = option("auto", choices=CPU_FIX_CHOICES, group=ENGINE,
                               help=f"--engine vllm: {CPU_FIX_HELP}")
    engine_log_dir: str | None = option(None, metavar="DIR", group=ENGINE, help="--engine vllm: "
                                        "where each replica's log goes (default: the "
                                        "temporary folder)")
    upstream: list[str] = option([], nargs="+", metavar="URL", group=ENGINE, help="serve the "
                                 "same API in front of vLLM servers already running (their base "
                                 "URLs; started with the bundle's serving/vllm.sh and "
                                 "--per-request-spec-decode-metrics detailed), recording and "
                                 "counting what they serve; draft swaps are refused")
    upstream_timeout: float = option(600.0, group=ENGINE, help="seconds a vLLM server may take "
                                     "to answer a request before the client gets a 504")

    @property
    def front(self) -> bool:
        """Whether vLLM decodes behind the front (``--engine vllm`` or ``--upstream``)."""
        return self.engine == "vllm" or bool(self.upstream)

    def validate(self) -> None:
        super().validate()
        self._validate_front()
        if self.bundle is None and self.target is None:
            raise ConfigError("give a BUNDLE directory, or --target (and --draft)")
        if not 0 < self.port < 65536:
            raise ConfigError(f"--port must lie in 1..65535, got {self.port}")
        for name, low in (("max_batch", 1), ("max_tokens_limit", 1), ("max_body_bytes", 1),
                          ("shutdown_timeout", 0)):
            if getattr(self, name) < low:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= {low}, got "
                                  f"{getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 8:
            raise ConfigError(f"--max-model-len must be >= 8, got {self.max_model_len}")
        for name in ("record_shard_mb", "record_quota_mb"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ConfigError(f"--{name.replace('_', '-')} must be a number of MB > 0, got "
                                  f"{getattr(self, name)}")
        days = self.record_retention_days
        if days is not None and not 0 < days < float("inf"):
            raise ConfigError(f"--record-retention-days must be a number of days > 0, got {days}")
        for label in self.route_labels:
            if label != clean_label(label) or label in (UNLABELED, "v1"):
                raise ConfigError(f"--route-labels: '{label}' cannot be a route label; use "
                                  f"lower-case letters, digits, _ . - (up to {LABEL_CHARS}), "
                                  f"not 'v1' or '{UNLABELED}'")
        if len(set(self.route_labels)) < len(self.route_labels):
            raise ConfigError(f"--route-labels names a label twice: {self.route_labels}")

    def _validate_front(self) -> None:
        """The vLLM front's flags: each where it applies, none of the built-in engine's."""
        for name in ("replicas", "tensor_parallel_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got "
                                  f"{getattr(self, name)}")
        if not 0 < self.upstream_timeout < float("inf"):
            raise ConfigError(f"--upstream-timeout must be a number of seconds > 0, got "
                              f"{self.upstream_timeout}")
        try:
            words = shlex.split(self.engine_args)
        except ValueError as e:
            raise ConfigError(f"--engine-args does not split into flags ({e}); quote it as one "
                              f"word: --engine-args '--max-num-seqs 64'") from None
        ours = {"--host", "--port", "--served-model-name", "--model", "--speculative-config",
                "--per-request-spec-decode-metrics", "--tensor-parallel-size", "-tp"}
        taken = sorted({w.split("=")[0] for w in words} & ours)
        if taken:
            raise ConfigError(f"--engine-args {taken[0]}: the front sets it (the address, the "
                              f"name, the bundle's speculative config, per-request metrics; "
                              f"--tensor-parallel-size is draftkit's flag); leave it out")
        started_here = [name for name in STARTED_HERE if self._given(name)]
        if started_here and self.upstream:
            raise ConfigError(f"--{started_here[0].replace('_', '-')} is for vLLM servers the "
                              f"front starts (--engine vllm); --upstream serves running ones")
        if started_here and self.engine != "vllm":
            raise ConfigError(f"--{started_here[0].replace('_', '-')} is for --engine vllm")
        engine_only = [name for name in ENGINE_ONLY if self._given(name)]
        if engine_only and self.front:
            raise ConfigError(f"--{engine_only[0].replace('_', '-')} is for draftkit's own "
                              f"engine; vLLM serves the bundle's K, dtype and draft as export "
                              f"wrote them (its own flags go in --engine-args)")

    def _given(self, name: str) -> bool:
        """Whether a flag differs from its default (the dataclass's own)."""
        return getattr(self, name) != _DEFAULTS[name]


# flags for the vLLM servers the front starts; flags of draftkit's own engine
STARTED_HERE = ("replicas", "tensor_parallel_size", "engine_args", "engine_log_dir",
                "vllm_cpu_fix")
ENGINE_ONLY = ("k", "k_max", "verify", "max_batch", "max_model_len", "max_tokens_limit",
               "fast_path", "device", "dtype", "draft")
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ServeArgs)
             if f.default is not dataclasses.MISSING}
