"""A request as the front passes it to vLLM: its body, its label, what the front adds to it and
takes out of the answer again, and the sampling vLLM applied to it (for its record).

The front adds ``return_token_ids`` (the ids a record keeps) and, to a stream, its usage chunk
(where vLLM puts the request's per-step speculative counts); an answer gets back only what the
client asked for. Sampling a request leaves unset is what the server applies: the target's
``generation_config.json`` over vLLM's defaults, as vLLM's ``--generation-config auto`` does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from draftkit.engines.preflight import flag_value
from draftkit.serve.upstream import Upstream
from draftkit.traffic.record import SamplingEntry

# vLLM's own defaults for a request that sets none; a server started with
# --generation-config auto (vLLM's default) takes the model's generation_config.json first
DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}


def sampling_defaults(target: str | Path, engine_args: tuple[str, ...] = ()) -> dict:
    """The sampling a vLLM server applies to a request that sets none: the target's
    ``generation_config.json`` (``temperature``, ``top_p``, ``top_k``) over vLLM's own, as
    ``--generation-config auto`` (vLLM's default) does; vLLM's own alone under
    ``--generation-config vllm``."""
    given = flag_value(list(engine_args), ("--generation-config",))
    if given == "vllm":
        return dict(DEFAULTS)
    path = Path(given) if given and given != "auto" else Path(target)
    try:
        config = json.loads((path / "generation_config.json").read_text())
    except (OSError, ValueError):
        return dict(DEFAULTS)
    out = dict(DEFAULTS)
    for key in DEFAULTS:
        value = config.get(key) if isinstance(config, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value
    return out


@dataclass
class Job:
    """One request's body and what the front read of it."""

    body: dict
    chat: bool
    domain: str
    record: bool
    arrived: float

    @property
    def wants_ids(self) -> bool:
        return self.body.get("return_token_ids") is True

    @property
    def wants_usage(self) -> bool:
        options = self.body.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True

    def upstream_body(self, upstream: Upstream, stream: bool) -> dict:
        body = {**self.body, "model": upstream.model, "return_token_ids": True}
        if stream:
            options = self.body.get("stream_options")
            body["stream_options"] = {**(options if isinstance(options, dict) else {}),
                                      "include_usage": True}
        return body

    def hide(self, body: dict) -> bool:
        """Take out the token ids the client did not ask for; -> whether a stream's chunk
        still says anything (a chunk vLLM sent only to carry ids does not)."""
        if self.wants_ids:
            return True
        body.pop("prompt_token_ids", None)
        said = False
        for choice in body.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            choice.pop("token_ids", None)
            choice.pop("prompt_token_ids", None)
            delta = choice.get("delta")
            said |= bool(choice.get("finish_reason") or choice.get("text") or (
                isinstance(delta, dict) and any(v for v in delta.values())))
        return said or "choices" not in body

    def sampling(self, prompt_len: int, context: int | None, defaults: dict,
                 draft_sample_method: str | None = None) -> SamplingEntry:
        """The request's sampling as vLLM applied it: its own settings, the server's defaults
        (:func:`sampling_defaults`) for the rest, the token budget what the context left, how
        the server chose drafts (None: not known)."""
        b = self.body

        def number(key: str, default: float) -> float:
            value = b.get(key)
            return float(value) if isinstance(value, (int, float)) and \
                not isinstance(value, bool) else default

        limit = b.get("max_completion_tokens") if self.chat and b.get("max_tokens") is None \
            else b.get("max_tokens")
        if not isinstance(limit, int) or isinstance(limit, bool):
            limit = max((context or prompt_len + 1) - prompt_len, 1)
        top_k = b.get("top_k", defaults["top_k"])
        seed = b.get("seed")
        return SamplingEntry(temperature=number("temperature", defaults["temperature"]),
                             top_p=number("top_p", defaults["top_p"]),
                             top_k=top_k if isinstance(top_k, int) and top_k > 0 else 0,
                             seed=seed if isinstance(seed, int) else None, max_tokens=limit,
                             draft_sample_method=draft_sample_method)
