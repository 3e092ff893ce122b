"""Talk to ``draftkit serve`` with the official OpenAI client.

    draftkit serve BUNDLE --port 8000 &
    python serve/client_example.py --url http://127.0.0.1:8000/v1

Prints a completion, a streamed chat answer, and the per-request speculation stats that the
server adds to each response under ``draftkit``.
"""

from __future__ import annotations

import argparse

from openai import OpenAI


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000/v1")
    args = ap.parse_args()
    client = OpenAI(base_url=args.url, api_key="unused")
    model = client.models.list().data[0].id

    r = client.completions.create(model=model, prompt="The capital of France is",
                                  max_tokens=16, temperature=0)
    print(repr(r.choices[0].text), r.usage, r.model_extra["draftkit"])

    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Write a haiku about rain."}],
        max_tokens=64, temperature=0.7, top_p=0.9, seed=1, stop=["\n\n"], stream=True,
        stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.choices:
            print(chunk.choices[0].delta.content or "", end="", flush=True)
        else:  # the last chunk: usage and speculation stats, no choices
            print("\n", chunk.usage, chunk.model_extra["draftkit"])


if __name__ == "__main__":
    main()
