"""The sampling vLLM applied to a request, for its record: the request's own settings, and the
server's defaults for what it leaves unset (the target's ``generation_config.json`` over
vLLM's own, as vLLM's ``--generation-config auto`` does). draftkit's front records requests
this way as it passes them to vLLM, and ``draftkit import-traffic`` records logged ones.
"""

from __future__ import annotations

import json
from pathlib import Path

from draftkit.engines.preflight import flag_value
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


def applied_sampling(body: dict, chat: bool, prompt_len: int, context: int | None,
                     defaults: dict, draft_sample_method: str | None = None) -> SamplingEntry:
    """The sampling vLLM applied to a request's ``body``: its own settings, the server's
    defaults (:func:`sampling_defaults`) for the rest, the token budget what the context left,
    how the server chose drafts (None: not known)."""

    def number(key: str, default: float) -> float:
        value = body.get(key)
        return float(value) if isinstance(value, (int, float)) and \
            not isinstance(value, bool) else default

    limit = body.get("max_completion_tokens") if chat and body.get("max_tokens") is None \
        else body.get("max_tokens")
    if not isinstance(limit, int) or isinstance(limit, bool):
        limit = max((context or prompt_len + 1) - prompt_len, 1)
    top_k = body.get("top_k", defaults["top_k"])
    seed = body.get("seed")
    return SamplingEntry(temperature=number("temperature", defaults["temperature"]),
                         top_p=number("top_p", defaults["top_p"]),
                         top_k=top_k if isinstance(top_k, int) and top_k > 0 else 0,
                         seed=seed if isinstance(seed, int) else None, max_tokens=limit,
                         draft_sample_method=draft_sample_method)
