"""A request as the front passes it to vLLM: its body, its label, what the front adds to it and
takes out of the answer again, and the sampling vLLM applied to it (for its record:
:mod:`draftkit.traffic.vllm_sampling`).

The front adds ``return_token_ids`` (the ids a record keeps) and, to a stream, its usage chunk
(where vLLM puts the request's per-step speculative counts); an answer gets back only what the
client asked for. Sampling a request leaves unset is what the server applies: the target's
``generation_config.json`` over vLLM's defaults, as vLLM's ``--generation-config auto`` does.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftkit.serve.upstream import Upstream
from draftkit.traffic.record import SamplingEntry
from draftkit.traffic.vllm_sampling import applied_sampling

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
        """The request's sampling as vLLM applied it (:func:`~draftkit.traffic.vllm_sampling.
        applied_sampling`)."""
        return applied_sampling(self.body, self.chat, prompt_len, context, defaults,
                                draft_sample_method)
