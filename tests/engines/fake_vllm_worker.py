"""A stand-in for draftkit/engines/vllm_worker.py, speaking its protocol without vLLM: the
release it reports, and whether it dies, come from the environment. Its answers are fixed
tokens with made-up counters: enough to drive draftkit's side of the pipe, never a figure.

FAKE_VLLM_VERSION: the release it reports (default 0.32.0);
FAKE_VLLM_DIE_AFTER: exit with status 3 on that many + 1st generate request;
FAKE_VLLM_CALLS: a file it appends one line to per generate request answered.
"""

import json
import os
import sys


def main() -> int:
    die_after = int(os.environ.get("FAKE_VLLM_DIE_AFTER", "-1"))
    served = 0
    for line in sys.stdin:
        msg = json.loads(line)
        op = msg["op"]
        if op == "quit":
            return 0
        if op == "hello":
            reply = {"vllm": os.environ.get("FAKE_VLLM_VERSION", "0.32.0"), "build": "cpu",
                     "torch": "2.13.0", "python": "3.11"}
        elif op == "generate":
            if served == die_after:
                print("RuntimeError: the fake engine died", file=sys.stderr, flush=True)
                os._exit(3)
            served += 1
            if os.environ.get("FAKE_VLLM_CALLS"):
                with open(os.environ["FAKE_VLLM_CALLS"], "a") as f:
                    f.write("generate\n")
            n = msg["sampling"]["max_tokens"]
            reply = {"outputs": [{"tokens": [5] * n, "finish": "length", "seconds": 0.01,
                                  "spec": {"drafts": n // 2, "draft_tokens": n,
                                           "accepted": 1, "accepted_per_pos": [1, 0, 0]}}
                                 for _ in msg["prompts"]]}
        else:
            reply = {}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
