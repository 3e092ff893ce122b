"""What a vLLM server's answers hold, read as data from another process: the token ids, the
accepted count of each verify step (``metrics.speculative_decoding`` with
``--per-request-spec-decode-metrics detailed``), the server-sent events of a stream, an error's
message. Each is checked before it is believed: ids of the vocabulary, counts that hold
together.

httpx is imported at the top: only the vLLM front imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from draftkit.metrics import alpha_from_counts


def rounds_of(spec: object) -> list[list[int]] | None:
    """vLLM's per-request speculative metrics as rounds ``[drafted, accepted]``, one per verify
    step; None where they are absent or do not hold together (a list of counts each, of equal
    length, 0 <= accepted <= drafted): data from another process, checked before believed."""
    if not isinstance(spec, dict):
        return None
    drafted, accepted = spec.get("per_step_drafted"), spec.get("per_step_accepted")
    if not isinstance(drafted, list) or not isinstance(accepted, list) or \
            len(drafted) != len(accepted):
        return None
    rounds = [[d, a] for d, a in zip(drafted, accepted)]
    if not all(type(d) is int and type(a) is int and 0 <= a <= d for d, a in rounds):
        return None
    return rounds


def ids(value: object, vocab: int) -> list[int] | None:
    """Token ids as vLLM returned them, if they are ids of this vocabulary."""
    if isinstance(value, list) and all(type(t) is int and 0 <= t < vocab for t in value):
        return value
    return None


def stats(rounds: list[list[int]] | None, completion_tokens: int, draft: str) -> dict:
    """The ``draftkit`` field of an answer, as the built-in engine's: drafted and accepted
    tokens, tau (tokens per verify step), alpha (truncation-corrected), mean K, target calls
    (the prefill included), the draft; None figures where vLLM reported no steps."""
    if rounds is None:
        return {"drafted": None, "accepted": None, "tau": None, "alpha": None, "k": None,
                "target_calls": None, "draft": draft}
    drafted = sum(d for d, _ in rounds)
    accepted = sum(a for _, a in rounds)
    rejected = sum(1 for d, a in rounds if a < d)
    steps = len(rounds)
    tau = (completion_tokens - 1) / steps if steps else 1.0
    return {"drafted": drafted, "accepted": accepted, "tau": round(max(tau, 1.0), 4),
            "alpha": round(alpha_from_counts(accepted, rejected), 4),
            "k": round(drafted / steps, 4) if steps else 0.0, "target_calls": steps + 1,
            "draft": draft}


@dataclass
class Served:
    """What one request's answer held: the fields a record needs, gathered from a body or from
    a stream's chunks, each choice's under its index."""

    prompt: list[int] | None = None
    completions: dict[int, list[int]] = field(default_factory=dict)  # choice index -> ids
    finishes: dict[int, str] = field(default_factory=dict)  # choice index -> finish reason
    spec: object = None
    bad_ids: bool = False  # some chunk's ids or index did not read as they should

    @property
    def completion(self) -> list[int]:
        """The first choice's ids: a request of n 1's completion."""
        return self.completions.get(0, [])

    def take_choice(self, choice: dict, vocab: int) -> None:
        index = choice.get("index", 0)
        if type(index) is not int or index < 0:
            self.bad_ids = True
            return
        if "prompt_token_ids" in choice and choice["prompt_token_ids"] is not None:
            self.take_prompt(choice["prompt_token_ids"], vocab)
        got = choice.get("token_ids")
        if got is not None:
            checked = ids(got, vocab)
            self.bad_ids |= checked is None
            self.completions.setdefault(index, []).extend(checked or [])
        if choice.get("finish_reason"):
            self.finishes[index] = choice["finish_reason"]

    def take_prompt(self, value: object, vocab: int) -> None:
        checked = ids(value, vocab)
        self.bad_ids |= checked is None
        self.prompt = checked

    def take_metrics(self, body: dict) -> None:
        """vLLM's per-request counts: in the body, or a stream's usage chunk."""
        metrics = body.get("metrics")
        if isinstance(metrics, dict) and metrics.get("speculative_decoding") is not None:
            self.spec = metrics["speculative_decoding"]


def upstream_message(body: object) -> str:
    """The message of an upstream's error body, in one line."""
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(message, str):
        message = body.get("message") if isinstance(body, dict) else None
    return " ".join(str(message or "no message").split())[:300]


async def events(answer: httpx.Response):
    """The ``data:`` payloads of a server-sent event stream, one per event."""
    data: list[str] = []
    async for line in answer.aiter_lines():
        if line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
        elif not line and data:
            yield "\n".join(data)
            data = []
    if data:
        yield "\n".join(data)
