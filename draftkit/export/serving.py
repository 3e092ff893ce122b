"""Serving configs written into a bundle: the same draft for vLLM, SGLang and HF transformers.

The flag names follow each project's documented conventions (serve/README.md shows them):
vLLM's ``speculative_config`` with ``method`` ``draft_model`` for a standalone draft and
``eagle3`` for an EAGLE-3 head (always said: vLLM guesses a method from the path otherwise);
SGLang's STANDALONE or EAGLE3 speculative algorithm, drafting a single chain (top-k 1); HF's
``assistant_model`` with a constant ``num_assistant_tokens``, which cannot run an EAGLE-3 head.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path


# the draft's kind -> (vLLM's speculative method, SGLang's speculative algorithm)
METHODS = {"standalone": ("draft_model", "STANDALONE"), "eagle3": ("eagle3", "EAGLE3")}


def vllm_speculative_config(draft_dir: str, k: int, kind: str = "standalone") -> dict:
    return {"method": METHODS[kind][0], "model": draft_dir, "num_speculative_tokens": k}


def sglang_flags(draft_dir: str, k: int, kind: str = "standalone") -> list[str]:
    # SGLang counts the verified tokens including the bonus one: K drafted + 1.
    return ["--speculative-algorithm", METHODS[kind][1], "--speculative-draft-model-path",
            draft_dir, "--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(k + 1)]


def hf_snippet(target: str, kind: str = "standalone", k: int = 1) -> str:
    if kind == "eagle3":
        return _eagle3_note(target, k)
    return f'''"""Speculative decoding with HF transformers and this bundle's draft.

The draft's generation_config.json already sets num_assistant_tokens (K), a constant
schedule and confidence threshold 0, so generate() uses exactly the recommended K.
"""
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

draft_dir = Path(__file__).resolve().parent.parent / "draft"  # found wherever the bundle is
target = AutoModelForCausalLM.from_pretrained({target!r})
draft = AutoModelForCausalLM.from_pretrained(draft_dir)
tokenizer = AutoTokenizer.from_pretrained(draft_dir)

messages = [{{"role": "user", "content": "Write a Python function that reverses a string."}}]
ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                    return_dict=True)["input_ids"]
out = target.generate(ids, assistant_model=draft, max_new_tokens=128, do_sample=False)
print(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
'''


def _eagle3_note(target: str, k: int) -> str:
    return f'''"""HF transformers cannot run this bundle's draft: it is an EAGLE-3 head.

HF assisted generation (generate(..., assistant_model=draft)) takes a draft that is a language
model over tokens. An EAGLE-3 head drafts from the target's own hidden states at three of its
layers, which assisted generation never hands to the assistant, so no HF snippet can run it.
Serve it with vLLM (vllm.sh) or SGLang (sglang.sh), or decode with draftkit, whose engine feeds
the head those hidden states from each verify pass, as this script does:

    draftkit generate --target {target} --draft BUNDLE --k {k} --prompt "..."
    draftkit serve BUNDLE
"""
from pathlib import Path

from draftkit.chat import encode_prompt
from draftkit.decode import SpeculativeEngine
from draftkit.models import load_pair

bundle = Path(__file__).resolve().parent.parent  # found wherever the bundle is
pair = load_pair({target!r}, str(bundle))
engine = SpeculativeEngine(pair.target, pair.draft)
ids = encode_prompt(pair.tokenizer, "Write a Python function that reverses a string.")
result = engine.generate([ids], k={k}, max_new_tokens=128, temperature=0.0)[0]
print(pair.tokenizer.decode(result.tokens, skip_special_tokens=True))
print(f"tau {{result.tau:.2f}}: tokens kept per target forward")
'''


# The scripts find the draft next to themselves, so a bundle still serves after it is moved or
# copied; vllm.json (for a config file or the Python API) names it where it was exported.
_HERE = ('here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
         'draft="$(cd "$here/../draft" && pwd)"\n')


def write_serving(folder: Path, target: str, draft_dir: str, k: int,
                  kind: str = "standalone") -> None:
    """``folder``/vllm.json, vllm.sh, sglang.sh and hf_transformers.py for this target, K and
    the draft's kind (``standalone`` or ``eagle3``).

    A recommended K of 0 means speculation did not pay on the measured traffic; the engines
    need K >= 1 to load a draft at all, so the files use K = 1 and say so.
    """
    folder.mkdir(parents=True, exist_ok=True)
    note = ""
    if k < 1:
        note = ("# NOTE: the evaluation recommends K = 0 (speculation did not pay for this draft "
                "on the measured traffic);\n# serving the target without a draft is faster. "
                "These commands use K = 1 so the draft can still be tried.\n")
        k = 1
    spec = vllm_speculative_config(draft_dir, k, kind)
    (folder / "vllm.json").write_text(json.dumps(spec, indent=2) + "\n")
    relocate = ("import json, sys; spec = json.load(open(sys.argv[1])); "
                "spec['model'] = sys.argv[2]; print(json.dumps(spec))")
    (folder / "vllm.sh").write_text(
        "#!/usr/bin/env bash\n# Serve the target with this bundle's draft in vLLM.\n" + note +
        _HERE + f'spec="$(python3 -c {shlex.quote(relocate)} "$here/vllm.json" "$draft")"\n'
        f'vllm serve {shlex.quote(target)} --speculative-config "$spec" "$@"\n')
    flags = " ".join('"$draft"' if a == "DRAFT" else shlex.quote(a)
                     for a in sglang_flags("DRAFT", k, kind))
    (folder / "sglang.sh").write_text(
        "#!/usr/bin/env bash\n# Serve the target with this bundle's draft in SGLang.\n" + note +
        _HERE + f"python -m sglang.launch_server --model-path {shlex.quote(target)} {flags} "
        f'"$@"\n')
    (folder / "hf_transformers.py").write_text(hf_snippet(target, kind, k))
