"""Per-request text: incremental detokenization and stop strings.

Tokens arrive a round at a time; the text sent so far must never be taken back. Each feed
decodes the whole output (a few hundred tokens at most, so this is cheap and always right for
tokenizers whose pieces merge, like byte-level BPE), sends what is new, and holds back

- a trailing U+FFFD: an incomplete UTF-8 character whose remaining bytes come next round;
- the last ``len(longest stop) - 1`` characters, which may be the start of a stop string.

A stop string ends the request with ``finish_reason="stop"``; it and everything after it are
cut from the output (as the OpenAI API does).
"""

from __future__ import annotations

from typing import Any


class TextStream:
    def __init__(self, tokenizer: Any, stops: list[str] | None = None):
        self.tokenizer = tokenizer
        self.stops = list(stops or [])
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0  # characters of the decoded text already sent
        self.stopped = False

    def feed(self, new_ids: list[int], final: bool = False) -> str:
        """Add tokens; return the text that can be sent now (all of it when ``final``)."""
        if self.stopped:
            return ""
        self.ids.extend(new_ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if self.stops:  # a stop may straddle what was sent and what is new
            begin = max(0, self.sent - self.hold)
            hits = [i for i in (text.find(s, begin) for s in self.stops) if i >= 0]
            if hits:
                self.stopped = True
                return self._send(text, min(hits))
        end = len(text)
        if not final:
            if text.endswith("\ufffd"):
                end -= 1
            end = max(self.sent, end - self.hold)
        return self._send(text, end)

    def _send(self, text: str, end: int) -> str:
        out = text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return out
