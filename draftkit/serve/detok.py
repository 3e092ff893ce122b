"""Per-request text: incremental detokenization and stop strings.

Tokens arrive a round at a time; the text sent so far must never be taken back. Tokens are
read one at a time with the offsets vLLM uses: a token is decoded together with the tokens
before it (at first the prompt's last few) and their text is cut off the front. Decoding a
token alone is wrong for SentencePiece tokenizers (Llama 2, Mistral, Gemma), which drop the
leading space of the first token decoded. A token's text waits for the next tokens while it

- ends in U+FFFD: an incomplete UTF-8 character (byte-level BPE pieces, or byte-fallback
  tokens like ``<0xE4>``, each of which decodes to its own U+FFFD) whose remaining bytes come
  next;
- is empty (a special token), so that the next token still has text before it.

The last ``len(longest stop) - 1`` characters are held back too: they may start a stop string.
A stop string ends the request with ``finish_reason="stop"``; it and everything after it are
cut from the output (as the OpenAI API does), and ``tokens`` stops at the token that
completed it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PROMPT_CONTEXT = 5  # prompt tokens decoded before the first output token, as in vLLM


class TextStream:
    def __init__(self, tokenizer: Any, stops: list[str] | None = None,
                 prompt: Sequence[int] = ()):
        self.tokenizer = tokenizer
        self.stops = list(stops or [])
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.ids = list(prompt[-PROMPT_CONTEXT:])
        # ids[prefix:read] were read already and give the text before the tokens after them
        self.prefix, self.read = 0, len(self.ids)
        self.text = ""  # the output's text read so far (cut at a stop string)
        self.sent = 0  # characters of ``text`` already sent
        self.tokens = 0  # output tokens the text covers
        self.stopped = False

    def feed(self, new_ids: list[int], final: bool = False) -> str:
        """Add tokens; return the text that can be sent now (all of it when ``final``)."""
        for token in new_ids:
            if self.stopped:
                break
            self.ids.append(token)
            self.tokens += 1
            self._read(force=False)
        if final and not self.stopped:
            self._read(force=True)
        end = len(self.text)
        if not (final or self.stopped):
            end = max(self.sent, end - self.hold)
        out = self.text[self.sent:end]
        self.sent = max(self.sent, end)
        return out

    def _read(self, force: bool) -> None:
        """Add the text of the tokens after ``read`` unless it must wait (see the module)."""
        def decode(ids: list[int]) -> str:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

        before = decode(self.ids[self.prefix:self.read])
        new = decode(self.ids[self.prefix:])[len(before):]
        if not new or (new.endswith("\ufffd") and not force):
            return
        self.prefix, self.read = self.read, len(self.ids)
        begin = max(0, len(self.text) - self.hold)  # a stop may straddle old and new text
        self.text += new
        hits = [i for i in (self.text.find(s, begin) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self.text = self.text[:min(hits)]
