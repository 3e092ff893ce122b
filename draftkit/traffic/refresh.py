"""``draftkit refresh``: retrain a bundle's draft on the traffic it served; export it only if
faster.

Online speculative decoding (Liu et al., arXiv 2310.07177) distils the draft on the queries a
server actually answers. Served traffic is the best data a draft can get: its completions are
samples of the target itself (speculative decoding is lossless), on the prompts users send.

1. The traffic ``draftkit serve --record`` kept is read and checked against the bundle's
   target and tokenizer (:func:`~draftkit.traffic.shards.read_traffic`: bad shards, duplicated
   and out-of-sequence records are named and left out, or refused with ``--strict``; records
   kept without their prompt are left out too, counted: there is nothing to train on); per
   domain, the most recent ``--heldout`` share of requests is set aside, never trained on. A
   domain with fewer than ``--min-requests`` requests is measured but not trained.
2. The bundle's own recipe (the manifest records it) trains its draft from where it is (a
   warm start: an EAGLE-3 head keeps its layers; its vocabulary is chosen again at its size
   on the training rows, the tokens it keeps keeping their rows, so traffic in words the
   first data lacked can be drafted; ``--keep-vocab`` keeps it) for ``--steps`` steps, on
   the older requests' token ids as they were served, each trained ``--traffic-repeat``
   times an epoch, beside the recipe's own data once (``--replay``), so domains the traffic
   lacks are not forgotten.
3. The old and the new draft decode the held-out requests side by side
   (:mod:`draftkit.traffic.compare`); ``--out`` is written only where the new one is faster
   beyond noise on the traffic mix and loses beyond noise on no domain the old one served
   well, by the cost model priced at the drafts' measured c and v (the wall-clock figures are
   reported beside: on a shared machine their intervals carry other processes' bursts).
   Otherwise nothing is written there, the command says why and exits non-zero.

The training run, its data and ``refresh.md`` (the comparison) stay in ``--work``.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from draftkit.decode.engine import SpeculativeEngine
from draftkit.distill.command import load_config
from draftkit.distill.trainer import train
from draftkit.errors import Declined, DraftkitError
from draftkit.export import export_bundle
from draftkit.io import atomic_write_text, take_lock
from draftkit.manifest import read_manifest
from draftkit.models import load_another_draft, load_pair, load_tokenizer, resolve_model
from draftkit.models.resolve import model_identity
from draftkit.signing import signer_of
from draftkit.traffic import compare
from draftkit.traffic.args import RefreshArgs
from draftkit.traffic.command import target_vocab
from draftkit.traffic.record import TrafficRecord, tokenizer_identity
from draftkit.traffic.shards import read_traffic


def split(records: list[TrafficRecord], heldout: float, min_requests: int
          ) -> tuple[list[TrafficRecord], list[TrafficRecord], list[str]]:
    """(train, held out, trained domains): per domain, the most recent ``heldout`` share
    (at least one request) held out; a domain with fewer than ``min_requests`` requests is
    held out whole."""
    by_domain: dict[str, list[TrafficRecord]] = {}
    for r in sorted(records, key=lambda r: r.time):
        by_domain.setdefault(r.domain, []).append(r)
    train, held, trained = [], [], []
    for domain, rs in by_domain.items():
        if len(rs) < min_requests:
            held += rs
            continue
        n = max(1, int(len(rs) * heldout + 0.5))  # half up: 10 x 0.25 holds out 3
        train += rs[:-n]
        held += rs[-n:]
        trained.append(domain)
    return train, held, trained


def refresh(args: RefreshArgs) -> Path:
    signer = signer_of(args)  # before any work: a missing or wrong key is named now
    out = Path(args.out)
    if out.exists():
        raise DraftkitError(f"{out} already exists; choose another --out (refresh never "
                            f"replaces a bundle)")
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = take_lock(out.parent / f".{out.name}.refresh.lock", f"another `draftkit refresh` is "
                     f"writing {out}; wait for it or choose another --out")
    try:
        return _refresh(args, out, signer)
    finally:
        lock.release()


def _refresh(args: RefreshArgs, out: Path, signer) -> Path:
    bundle = Path(args.bundle)
    manifest = read_manifest(bundle)  # its seal checked before anything is used
    target_ref = resolve_model(str(bundle), "target")
    tokenizer = load_tokenizer(target_ref, "target")
    traffic = read_traffic(args.traffic, target=model_identity(target_ref),
                           tokenizer=tokenizer_identity(tokenizer),
                           vocab=target_vocab(target_ref, tokenizer), strict=args.strict)
    for line in traffic.integrity.lines():
        print(line)
    records = [r for r in traffic if r.prompt_ids is not None]
    if len(records) < len(traffic):
        print(f"left out: {len(traffic) - len(records)} of {len(traffic)} requests recorded "
              f"without their prompt (--no-record-prompts): nothing to train on or decode")
    if not records:
        raise DraftkitError(f"{args.traffic}: every request was recorded without its prompt "
                            f"(--no-record-prompts); refresh trains on prompts and their "
                            f"answers: record with prompts kept")
    train_rs, held, trained = split(records, args.heldout, args.min_requests)
    if not trained:
        raise DraftkitError(f"{args.traffic}: no domain has {args.min_requests} requests to "
                            f"train on ({len(records)} in all); record more traffic or lower "
                            f"--min-requests")
    work = Path(args.work) if args.work else out.parent / f"{out.name}.work"
    print(f"traffic: {len(records)} requests; training on {len(train_rs)} of "
          f"{', '.join(trained)}, comparing on the {len(held)} most recent", flush=True)
    cfg = _config(args, manifest, bundle, work, train_rs)

    best = train(cfg)
    k = args.k or max(1, manifest.num_speculative_tokens)
    rows, (ok, why) = _compare(args, bundle, best, held, k)
    _write_comparison(work, rows, ok, why, k)
    if not ok:  # the answer is no: exit status 3, not an error
        raise Declined(f"{out} not written: {why}; the comparison is in "
                            f"{work / 'refresh.md'}")

    target = "embedded" if manifest.target.kind == "embedded" else manifest.target.path
    written = export_bundle(target, str(best), out, k=k, recipe=work / "distill" / "config.yaml",
                            signer=signer)
    print(f"{why}: wrote {written} (serve it, or swap it into a running server)")
    return written


def _config(args: RefreshArgs, manifest, bundle: Path, work: Path,
            train_rs: list[TrafficRecord]):
    """The bundle's recipe, warm-starting its draft on the training requests' ids."""
    if args.recipe:
        recipe = Path(args.recipe)
        base = yaml.safe_load(recipe.read_text())
    elif manifest.recipe is not None and manifest.recipe.config:
        base = manifest.recipe.config
    else:
        raise DraftkitError(f"{bundle} records no distillation recipe; pass --recipe")
    rows = "".join(json.dumps({"domain": r.domain, "prompt_ids": r.prompt_ids,
                               "response_ids": r.completion_ids}) + "\n"
                   for r in train_rs if r.completion_ids)
    data = work / "data" / "traffic.jsonl"
    atomic_write_text(data, rows)
    sources = [{"path": str(data), "repeat": args.traffic_repeat}]
    replayed = [s for s in (base.get("data") or {}).get("sources", []) if args.replay
                and Path(s.get("path", "")).is_file()]
    sources += replayed  # their held-out rows too: best/ must not forget what they teach
    recipe = work / "recipe.yaml"
    atomic_write_text(recipe, yaml.safe_dump(base, sort_keys=False))
    per_domain = {}
    for r in train_rs:
        per_domain[r.domain] = per_domain.get(r.domain, 0) + 1
    heldout = max(1, min((base.get("data") or {}).get("heldout_per_domain", 6),
                         min(per_domain.values()) // 4))
    every = max(1, args.steps // 6)
    n = manifest.draft.draft_vocab_size  # an EAGLE-3 head's N: chosen again at that size
    draft = [f"draft.draft_vocab_size={'null' if args.keep_vocab or n is None else n}"] \
        if (base.get("draft") or {}).get("kind") == "eagle3" else \
        ["draft.derive_layers=null", "draft.num_layers=null"]
    on_policy = ["data.regime=on_policy", f"data.lmbda={args.on_policy}"] \
        if args.on_policy > 0 else []
    return load_config(recipe, [
        f"out_dir={work / 'distill'}", f"target={bundle}", f"draft.model={bundle}", *draft,
        *on_policy,
        f"data.sources={json.dumps(sources)}", f"data.heldout_per_domain={heldout}",
        "data.truncate=true", f"max_steps={args.steps}",
        f"max_minutes={'null' if args.minutes is None else args.minutes}",
        f"eval.every={every}", f"train.checkpoint_every={every}", "resume=true",
        *args.overrides])


def _compare(args: RefreshArgs, bundle: Path, best: Path, held: list[TrafficRecord], k: int):
    pair = load_pair(str(bundle), str(bundle), device=args.device)
    engines = {"old": SpeculativeEngine(pair.target, pair.draft),
               "new": SpeculativeEngine(pair.target, load_another_draft(pair, str(best),
                                                                         device=args.device))}
    warm = held[:1]  # one untimed pass, so one-time costs land in no measurement
    compare.measure(engines, warm, k, 4, progress=False)
    rows = compare.measure(engines, held, k, args.max_new_tokens)
    return rows, compare.decide(rows)


def _write_comparison(work: Path, rows, ok: bool, why: str, k: int) -> None:
    text = (f"# Refresh: old vs new draft on held-out traffic\n\nK = {k} for both; speedups "
            f"are paired over requests, 95% intervals: first by the cost model (each request's "
            f"rounds priced at the draft's measured c and v), which decides, then measured by "
            f"the wall clock.\n\n{compare.table(rows)}\n\n"
            f"**{'exported' if ok else 'not exported'}**: {why}\n")
    atomic_write_text(work / "refresh.md", text)
    atomic_write_text(work / "refresh.json", json.dumps(
        {"k": k, "exported": ok, "why": why, "domains": [r.to_dict() for r in rows]},
        indent=2) + "\n")
    print(compare.table(rows))
    print(("exported: " if ok else "not exported: ") + why, flush=True)
