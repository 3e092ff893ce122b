"""``draftkit serve BUNDLE --engine vllm`` (and ``--upstream URL ...``): the front built over vLLM.

::

    draftkit serve BUNDLE --engine vllm --replicas 2 --record traffic/
    draftkit serve BUNDLE --engine vllm --tensor-parallel-size 4 --engine-args '--max-num-seqs 64'
    draftkit serve BUNDLE --upstream http://10.0.0.5:8000 http://10.0.0.6:8000 --record traffic/

With ``--engine vllm`` the front starts the replicas (:mod:`draftkit.serve.replicas`), waits
for them, and stops them when it stops. With ``--upstream`` it serves vLLM servers someone else
runs (started with the bundle's ``serving/vllm.sh`` and ``--per-request-spec-decode-metrics
detailed``, so their answers carry the counts recording needs): recording and metrics work the
same, a draft swap is refused (the front cannot restart servers it does not own).

Either way the bundle names what is served: its target's and tokenizer's identities go into
every record, and its draft's identity labels each upstream (the front cannot see the weights
of a server it did not start: an ``--upstream`` serving another bundle is recorded under this
one's name; start it with this bundle's ``vllm.sh``).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from draftkit.engines.vllm_cpu_fix import ISSUE as CPU_FIX_ISSUE
from draftkit.errors import ConfigError
from draftkit.manifest import NAME as MANIFEST
from draftkit.manifest import read_manifest
from draftkit.models.load import load_tokenizer
from draftkit.models.resolve import model_identity, resolve_model
from draftkit.serve import replicas as R
from draftkit.serve.app import create_proxy_app
from draftkit.serve.args import TOKEN_ENV
from draftkit.serve.http import RequestError
from draftkit.serve.upstream import Pool, discover
from draftkit.serve.vllm_swap import BlueGreen
from draftkit.traffic.recorder import MB, check_folder, open_recorder
from draftkit.traffic.vllm_sampling import sampling_defaults


class NoSwap:
    """``POST /admin/draft`` in front of servers this front did not start: refused."""

    busy = False
    replicas: list = []

    def attach(self, pool, metrics, recorder) -> None:
        pass

    async def swap(self, bundle: str) -> dict:
        raise RequestError("this front serves vLLM servers it did not start (--upstream): it "
                           "cannot restart them with another draft; start them with the new "
                           "bundle's serving/vllm.sh and point --upstream at them", "bundle",
                           409, "swap_unavailable")


def build_front(args, name: str):
    """(app, description, close) for the serve command's ``args`` over vLLM; ``close`` stops
    the replicas serving (the app's lifespan does too; this is for a server that never
    started)."""
    bundle = Path(args.bundle).expanduser() if args.bundle else None
    if bundle is None or not (bundle / MANIFEST).is_file():
        raise ConfigError("--engine vllm and --upstream serve a bundle from `draftkit export` "
                          "(its serving config and identities): give BUNDLE")
    if args.record is not None:  # before anything starts: a full folder is refused at once
        check_folder(args.record, int(args.record_quota_mb * MB))
    target_ref = resolve_model(args.target or str(bundle), "target")
    draft = model_identity(resolve_model(str(bundle), "draft"))
    tokenizer = load_tokenizer(target_ref)
    config = json.loads((Path(target_ref.path) / "config.json").read_text())
    vocab = int(config.get("text_config", config).get("vocab_size") or len(tokenizer))
    swapper: BlueGreen | NoSwap = NoSwap()
    recorder = None
    try:
        if args.upstream:
            upstreams = [discover(url, draft) for url in args.upstream]
            where = f"vLLM at {', '.join(u.url for u in upstreams)} (--upstream)"
        else:
            swapper = start_replicas(args, name, bundle, target_ref.path)
            upstreams = [discover(r.url, draft, r.draft_sample_method) for r in swapper.replicas]
            where = f"{len(upstreams)} vLLM server(s) ({swapper.launch.release}) started here"
        if args.record:
            recorder = open_recorder(args, target_ref, tokenizer)
        app = create_proxy_app(Pool(upstreams, read_timeout=args.upstream_timeout),
                               model_name=name, vocab=vocab, swapper=swapper,
                               max_body_bytes=args.max_body_bytes,
                               route_labels=tuple(args.route_labels), recorder=recorder,
                               admin_token=args.admin_token or os.environ.get(TOKEN_ENV) or None,
                               defaults=sampling_defaults(target_ref.path, tuple(
                                   shlex.split(args.engine_args))),
                               on_stop=lambda: R.stop_all(swapper.replicas))
    except BaseException:
        R.stop_all(swapper.replicas)
        if recorder is not None:
            recorder.stop()
        raise
    app.state.metrics.eval_figures(read_manifest(bundle).domains)

    def close() -> None:
        R.stop_all(swapper.replicas)
        if recorder is not None and recorder.recording:
            recorder.stop()

    desc = f"model '{name}': {where}, draft {draft} of bundle {bundle}"
    if recorder is not None:
        desc += (f"; recording into {recorder.folder} ({recorder.used / MB:.1f} of "
                 f"{args.record_quota_mb:g} MB used)")
    return app, desc, close


def start_replicas(args, name: str, bundle: Path, target_path) -> BlueGreen:
    """``--replicas`` vLLM servers for ``bundle``, up and answering; -> the swapper that owns
    them. A replica that fails to start stops them all (one line naming its log)."""
    launch = R.Launch.find(name, args.engine_python, args.vllm_cpu_fix,
                           tensor_parallel_size=args.tensor_parallel_size,
                           engine_args=tuple(shlex.split(args.engine_args)), target=args.target,
                           log_dir=Path(args.engine_log_dir).expanduser()
                           if args.engine_log_dir else None)
    places = R.placements(args.replicas, args.tensor_parallel_size, launch.cpu)
    swapper = BlueGreen(launch, [], places, target_path)
    say(f"starting {args.replicas} vLLM server(s) ({launch.release}) for {bundle}" + (
        f", with draftkit's correction of {CPU_FIX_ISSUE} (its sampled verification)"
        if launch.cpu_fix else ""))
    try:
        for i, place in enumerate(places):
            swapper.replicas.append(R.start(launch, str(bundle), place, i))
        R.wait_ready(swapper.replicas, progress=lambda r: say(
            f"vLLM at {r.url} is up (its log: {r.log})"))
    except BaseException:
        R.stop_all(swapper.replicas)
        raise
    return swapper


def say(line: str) -> None:
    print(f"draftkit serve: {line}", file=sys.stderr, flush=True)
