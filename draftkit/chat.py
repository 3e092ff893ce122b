"""Turning user prompts into token ids, the same way in every stage, and reading them from a file.

Prompts go through the target's chat template (a system prompt, the user turn, and the
assistant header), so the draft is trained and evaluated on exactly what serving sends.
``raw=True`` skips the template and tokenizes the text as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftkit.errors import DraftkitError
from draftkit.io import read_jsonl

Prompt = str | list[dict[str, str]]  # plain text, or OpenAI-style messages


def as_messages(prompt: Prompt) -> list[dict[str, str]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m and "content" in m
                                        for m in prompt):
        return prompt
    raise DraftkitError("a prompt must be text or a list of {\"role\", \"content\"} messages")


def render_prompt(tokenizer: Any, prompt: Prompt, raw: bool = False) -> str:
    """The text the target sees, with the assistant header appended for generation."""
    if raw:
        if not isinstance(prompt, str):
            raise DraftkitError("--raw takes plain text prompts, not chat messages")
        return prompt
    if not getattr(tokenizer, "chat_template", None):
        if isinstance(prompt, str):
            return prompt  # base models without a template take the text as it is
        raise DraftkitError("the target's tokenizer has no chat template; pass plain-text "
                            "prompts with --raw")
    return apply_template(tokenizer, as_messages(prompt), add_generation_prompt=True)


def apply_template(tokenizer: Any, messages: list[dict[str, str]],
                   add_generation_prompt: bool) -> str:
    """The chat template's text for ``messages``. A template may refuse them itself
    (``raise_exception("System role not supported")``): that is one DraftkitError."""
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=add_generation_prompt)
    except Exception as e:
        raise DraftkitError(f"the chat template cannot render these messages "
                            f"({type(e).__name__}: {e})") from None


def encode_prompt(tokenizer: Any, prompt: Prompt, raw: bool = False) -> list[int]:
    """Token ids of a prompt; an empty prompt is an error."""
    if not (prompt.strip() if isinstance(prompt, str) else prompt):
        raise DraftkitError("empty prompt; give some text")
    text = render_prompt(tokenizer, prompt, raw)
    # A template's text already holds its special tokens; plain text (raw, or for a target
    # without a template) gets the tokenizer's own, such as a base model's BOS, as the text
    # rows it was trained on did
    templated = not raw and bool(getattr(tokenizer, "chat_template", None))
    ids = tokenizer(text, add_special_tokens=not templated)["input_ids"]
    if not ids:
        raise DraftkitError("the prompt encodes to no tokens; give some text")
    return list(ids)


def read_prompts(path: str | Path) -> list[Prompt]:
    """Prompts from a JSONL file: strings, {"prompt": ...} or {"messages": [...]} per line."""
    out = []
    for source, row in read_jsonl(path, "prompts file", "pass a JSONL file (UTF-8, one string, "
                                  "{\"prompt\": ...} or {\"messages\": [...]} per line)"):
        if isinstance(row, dict):
            row = row.get("messages", row.get("prompt"))
        if not isinstance(row, (str, list)) or not row:
            raise DraftkitError(f"{source}: expected a non-empty string, {{\"prompt\": ...}} "
                                f"or {{\"messages\": [...]}}")
        out.append(row)
    if not out:
        raise DraftkitError(f"{path} holds no prompts")
    return out
