"""A regime map from start to end: the suite and models loaded, the drafts built, every regime
measured and analysed into a :class:`~draftkit.figures.RegimesReport`."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from draftkit.chat import encode_prompt
from draftkit.decode.dtype_choice import load_decoding_pair
from draftkit.evaluate.regimes.analysis import (batch_regime, cost_regime, entropy_regime, headline,
                                                mismatch_regime)
from draftkit.evaluate.regimes.drafts import build_drafts, num_layers
from draftkit.evaluate.regimes.measure import INTERVALS, measure, planned_runs
from draftkit.evaluate.settings import EvalSettings
from draftkit.evaluate.suite import by_domain, load_suite
from draftkit.figures import RegimesReport, now


def regime_map(target: str, draft: str | None, suite: Path, *, k: int, k_max: int, seed: int,
               max_new_tokens: int, temperatures: list[float], layer_sizes: list[int],
               batch_sizes: list[int], prompts_per_domain: int, batch_groups: int = 2,
               drafts_by_domain: dict[str, str], domains: list[str] | None = None,
               device: str | None = None, dtype: str = "auto") -> RegimesReport:
    """Measure all four regimes at the fixed K and return the report: ``prompts_per_domain``
    prompts of each domain, ``max_new_tokens`` each, the main draft at each of
    ``temperatures``, early exits of ``layer_sizes`` layers and the ``drafts_by_domain``
    ({domain: path}) at T = 0; the batch regime over up to ``batch_groups`` batches of
    distinct prompts at each batch size (it takes as many prompts as that many of its largest
    batch)."""
    started = time.perf_counter()
    n_batch = max(batch_sizes, default=1) * batch_groups  # distinct prompts for every batch
    rows = load_suite(suite, limit=max(prompts_per_domain, n_batch), domains=domains)
    pair, chosen = load_decoding_pair(target, draft, device=device, dtype=dtype)
    groups = {d: [encode_prompt(pair.tokenizer, r.prompt) for r in g]
              for d, g in by_domain(rows).items()}
    prompts = {d: ids[:prompts_per_domain] for d, ids in groups.items()}
    names = list(groups)
    torch.manual_seed(seed)
    drafts = build_drafts(pair, names, layer_sizes, drafts_by_domain, device,
                          chosen.dtype)
    main = next(d for d in drafts if d.main)
    settings = EvalSettings(k=k, k_max=k_max, temperature=0.0, max_new_tokens=max_new_tokens,
                            repeats=1, seed=seed, k_sweep=[], batch_sizes=list(batch_sizes),
                            batch_groups=batch_groups)
    total = planned_runs(sum(map(len, prompts.values())), len(names), len(drafts), temperatures,
                         batch_sizes)
    with tqdm(total=total, desc="regimes", unit="run", dynamic_ncols=True) as bar:
        raw = measure(pair, drafts, prompts, groups, settings, temperatures, bar)
    infos = [d.info() for d in drafts]
    report = RegimesReport(
        target=pair.target_ref.name, draft=main.name, target_layers=num_layers(pair.target),
        device=str(next(pair.target.parameters()).device),
        dtype=chosen.dtype, dtype_choice=chosen.describe(), k=k,
        k_max=k_max, max_new_tokens=max_new_tokens, prompts_per_domain=prompts_per_domain,
        domains=names, drafts=infos,
        entropy=entropy_regime(main.name, raw.by_temperature, raw.temperatures, k),
        draft_cost=cost_regime(infos, raw.at_zero, k),
        mismatch=mismatch_regime(infos, raw.at_zero, names),
        batch=batch_regime(main.name, raw.batch, k), created=now(), seconds=None)
    report.headline = headline(report)
    report.intervals = INTERVALS
    report.seconds = time.perf_counter() - started
    return report
