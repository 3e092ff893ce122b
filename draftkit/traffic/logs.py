"""``draftkit import-traffic``: the OpenAI-style request logs a team already keeps, as traffic.

    draftkit import-traffic logs/requests-*.jsonl --bundle BUNDLE --into runs/traffic
    draftkit import-traffic batch_input.jsonl batch_output.jsonl --bundle BUNDLE \\
        --into runs/traffic --domain support

Each line of a log is a request and its answer, in one of the shapes such logs take:

- ``{"request": BODY, "response": ANSWER}``: a chat or text completion's request body and its
  answer (a gateway's or logging proxy's log; the answer may sit under ``response.body``);
- the OpenAI Batch API's files: input lines ``{"custom_id", "body"}`` and output lines
  ``{"custom_id", "response": {"status_code", "body"}}``, joined by ``custom_id`` across every
  file given.

Each choice of an answer becomes one record in the folder, written by the recorder ``draftkit
serve --record`` uses (same shards, format and quota), so ``draftkit traffic`` and ``draftkit
refresh`` read it as served traffic. The prompt is rendered with the bundle target's chat
template (chat) or tokenized as vLLM tokenizes a text completion's; the answer's text is
tokenized, and an end of turn (the tokenizer's EOS) appended where it finished with ``stop``
and the request named no stop strings. These are the text's tokens: the ids the engine sampled
unless the text has another tokenization, which the usage counts in the log let the import
check (a mismatch is counted and said). The record's sampling is the request's over the
target's ``generation_config.json`` and vLLM's defaults; its time the answer's ``created``; its
label the request's ``metadata.domain`` or ``user``, else ``--domain``; its ``source``
``imported``, no draft (nobody knows which served it) and no rounds: ``draftkit traffic
--bundle`` replays its acceptance (:mod:`draftkit.traffic.replay`).

A line that is not JSON is an error naming it (the file is not a JSONL log); a request that
cannot become a record (an error answer, no choices, content that is not text, a batch line
without its pair) is skipped and counted by why.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from draftkit.chat import encode_prompt
from draftkit.errors import DraftkitError
from draftkit.io import read_jsonl
from draftkit.models.resolve import model_identity
from draftkit.traffic.args import ImportArgs
from draftkit.traffic.command import bundle_target
from draftkit.traffic.record import IMPORTED, request_label, tokenizer_identity
from draftkit.traffic.recorder import Recorder
from draftkit.traffic.vllm_sampling import applied_sampling, sampling_defaults

# why a request was skipped
ERROR, NO_CHOICES, NOT_TEXT, UNPAIRED, UNKNOWN = (
    "an error answer", "an answer without choices", "a prompt or answer that is not text",
    "a batch line without its pair", "not a request with its answer")


@dataclass
class Entry:
    """One request and its answer, read from a log."""

    where: str  # file:line
    request: dict
    answer: dict


def read_logs(paths: list[str]) -> tuple[list[Entry], Counter]:
    """The logs' requests with their answers, and the lines skipped by why."""
    entries, skipped = [], Counter()
    batch_in: dict[str, tuple[str, dict]] = {}
    batch_out: dict[str, tuple[str, object]] = {}
    remedy = "give JSONL logs: one JSON object per line"
    for path in paths:
        for where, row in read_jsonl(path, "request log", remedy):
            if not isinstance(row, dict):
                skipped[UNKNOWN] += 1
            elif isinstance(row.get("request"), dict) and "response" in row:
                _pair(entries, skipped, where, row["request"], row["response"])
            elif "custom_id" in row and isinstance(row.get("body"), dict):
                batch_in[str(row["custom_id"])] = (where, row["body"])
            elif "custom_id" in row and "response" in row:
                batch_out[str(row["custom_id"])] = (where, row["response"])
            else:
                skipped[UNKNOWN] += 1
    for cid, (where, body) in batch_in.items():
        if cid in batch_out:
            _pair(entries, skipped, where, body, batch_out[cid][1])
        else:
            skipped[UNPAIRED] += 1
    skipped[UNPAIRED] += sum(cid not in batch_in for cid in batch_out)
    return entries, skipped


def _pair(entries: list[Entry], skipped: Counter, where: str, request: dict,
          response: object) -> None:
    """Add the request with its answer (a Batch API response's ``body``), or count why not."""
    if isinstance(response, dict) and isinstance(response.get("body"), dict) and \
            "choices" not in response:
        if response.get("status_code", 200) != 200:
            skipped[ERROR] += 1
            return
        response = response["body"]
    if not isinstance(response, dict) or "error" in response:
        skipped[ERROR] += 1
    elif not isinstance(response.get("choices"), list) or not response["choices"]:
        skipped[NO_CHOICES] += 1
    else:
        entries.append(Entry(where, request, response))


def _text(content: object) -> str | None:
    """A message's content as text: a string, or the text of its parts; None otherwise."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and
                                         isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    return None


def prompt_ids(tokenizer, request: dict) -> list[int] | None:
    """The request's prompt as the server rendered it (chat messages through the template, a
    text completion's text tokenized, its token ids as sent); None where it is none of them."""
    if isinstance(request.get("messages"), list):
        messages = []
        for m in request["messages"]:
            text = _text(m.get("content")) if isinstance(m, dict) else None
            if text is None or not isinstance(m.get("role"), str):
                return None
            messages.append({**m, "content": text})
        return encode_prompt(tokenizer, messages) if messages else None
    prompt = request.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, list) and prompt and all(type(t) is int and 0 <= t < len(tokenizer)
                                                   for t in prompt):
        return list(prompt)  # token ids, as the request sent them
    return encode_prompt(tokenizer, prompt, raw=True) if isinstance(prompt, str) and \
        prompt.strip() else None


def completion_ids(tokenizer, request: dict, choice: dict) -> list[int] | None:
    """A choice's answer as token ids (module docstring); None where it is not text."""
    message = choice.get("message")
    text = _text(message.get("content")) if isinstance(message, dict) else \
        choice.get("text") if isinstance(choice.get("text"), str) else None
    if text is None:
        return None
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if choice.get("finish_reason") == "stop" and not request.get("stop") and \
            tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return ids


def import_traffic(args: ImportArgs) -> dict:
    """``draftkit import-traffic``: read the logs, write the records; -> what it did."""
    entries, skipped = read_logs(args.logs)
    _, target_ref, tokenizer = bundle_target(args.bundle)
    defaults = sampling_defaults(target_ref.path)
    todo, requests, mismatched = [], 0, 0
    for e in entries:
        chat = isinstance(e.request.get("messages"), list)
        try:
            prompt = prompt_ids(tokenizer, e.request)
        except DraftkitError:
            prompt = None  # a template that refuses the messages, an empty prompt
        answers = [completion_ids(tokenizer, e.request, c) if isinstance(c, dict) else None
                   for c in e.answer["choices"]]
        if prompt is None or None in answers:
            skipped[NOT_TEXT] += 1
            continue
        requests += 1
        usage = e.answer.get("usage")
        served = usage.get("completion_tokens") if isinstance(usage, dict) else None
        mismatched += isinstance(served, int) and served != sum(map(len, answers))
        created = e.answer.get("created")
        domain = request_label(e.request.get("metadata"), e.request.get("user"), args.domain)
        for choice, ids in zip(e.answer["choices"], answers):
            # no max_tokens in the request: the answer's length stands for its budget
            todo.append(dict(domain=domain, prompt_ids=prompt, completion_ids=ids,
                             sampling=applied_sampling(e.request, chat, len(prompt),
                                                       len(prompt) + len(ids), defaults),
                             finish_reason=str(choice.get("finish_reason") or "stop"),
                             rounds=None, draft=None, source=IMPORTED,
                             when=float(created) if isinstance(created, (int, float))
                             else None))
    reasons = ", ".join(f"{n} {why}" for why, n in sorted(skipped.items()))
    if not todo:
        raise DraftkitError(f"nothing to import from {', '.join(args.logs)} "
                            f"({reasons or 'no lines'}); give logs of requests with their "
                            f"answers: {{\"request\", \"response\"}} per line, or the Batch "
                            f"API's input and output files")
    recorder = Recorder(args.into, target=model_identity(target_ref),
                        tokenizer=tokenizer_identity(tokenizer))
    recorder.start()
    try:
        for item in todo:
            recorder.add(**item)
    finally:
        recorder.stop()
    print(f"imported {len(todo)} records of {requests} requests into {args.into}"
          + (f"; skipped {reasons}" if reasons else ""))
    if mismatched:
        print(f"note: {mismatched} answers tokenize to another length than their log's usage "
              f"says: their text has another tokenization than the ids served, so their "
              f"replayed acceptance is approximate")
    print(f"next: draftkit traffic {args.into} --bundle {args.bundle}")
    return {"records": len(todo), "requests": requests, "skipped": dict(skipped),
            "mismatched": mismatched}
