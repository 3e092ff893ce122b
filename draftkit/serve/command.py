"""``draftkit serve``: serve a bundle over an OpenAI-compatible HTTP API.

Commands::

    draftkit serve BUNDLE                                  # target and draft from the bundle
    draftkit serve BUNDLE --k 3 --max-batch 8 --port 8001  # fixed K, 8 slots
    draftkit serve --target embedded --draft drafts/smol-4l --k auto
    draftkit serve --target embedded --k 0                 # plain decoding, no draft
    draftkit serve BUNDLE --record traffic/ --route-labels code,math,chat
    draftkit serve BUNDLE --engine vllm --replicas 2 --record traffic/   # vLLM behind the front
    draftkit serve BUNDLE --upstream http://10.0.0.5:8000 --record traffic/

Then ``curl localhost:8000/v1/chat/completions -d '{"model": "...", "messages": [...]}'`` or
any OpenAI client with ``base_url="http://localhost:8000/v1"``; see serve/README.md.

``--record DIR`` appends each finished request to traffic shards in DIR
(:mod:`draftkit.traffic.recorder`; read by ``draftkit traffic`` and ``draftkit refresh``):
token ids, sampling, finish reason, each round's K and accepted count, the models'
identities and a domain label; never text nor a header. The label is the request's
``metadata.domain`` (OpenAI's ``metadata``, accepted on both endpoints), else its ``user``,
else its route's: with ``--route-labels code,math`` the API is served under ``/code/v1`` and
``/math/v1`` too (``base_url="http://host:8000/code/v1"``), else "unlabeled". A request with
``metadata: {"draftkit_record": "off"}`` is served but not recorded; aborted requests are not
recorded. The label also splits /metrics' acceptance per domain (serve/metrics.py). The ids
are the users' prompts and answers: ``--no-record-prompts`` keeps no prompt ids (the completion
and the engine's counts only).
SIGINT / SIGTERM stop admitting, let in-flight requests finish (up to
``--shutdown-timeout`` seconds), cancel the rest and exit 0.

A new draft without a restart: start with ``--admin-token`` (or ``DRAFTKIT_ADMIN_TOKEN`` in the
environment, which ``ps`` does not show), then ``POST /admin/draft`` with ``{"bundle": DIR}``
and ``Authorization: Bearer TOKEN``. The bundle is checked as ``draftkit check`` checks it and
must record this server's target; requests in flight finish on the old draft, later ones get
the new; a refused bundle leaves the old draft serving (:mod:`draftkit.serve.swap`).

``--engine vllm`` starts vLLM's own OpenAI server(s) with the bundle and serves the same API,
recording, metrics and swaps in front of them; ``--upstream`` does so over servers already
running (:mod:`draftkit.serve.vllm_front`).
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

from draftkit.decode.choice import KChoice
from draftkit.decode.dtype_choice import load_decoding_pair
from draftkit.decode.engine import SpeculativeEngine
from draftkit.errors import ConfigError, DraftkitError
from draftkit.extras import require
from draftkit.manifest import NAME as MANIFEST
from draftkit.manifest import read_manifest
from draftkit.models.resolve import model_identity
from draftkit.serve.args import DEFAULT_MAX_MODEL_LEN, TOKEN_ENV, ServeArgs
from draftkit.traffic.recorder import MB, check_folder, open_recorder

NO_DRAFT = "none"  # --draft none: plain decoding, even when the bundle holds a draft


def resolve_models(args: ServeArgs) -> tuple[str, str | None, str]:
    """(target spec, draft spec or None, served model name) from the bundle and flags."""
    target, name = args.target, args.served_model_name
    plain = args.draft.lower() == NO_DRAFT
    draft = None if plain else args.draft or None
    if args.bundle is not None:
        path = Path(args.bundle).expanduser()
        if not path.is_dir():
            raise ConfigError(f"{path} is not a directory; pass a bundle from `draftkit export` "
                              f"or a model directory")
        if (path / MANIFEST).is_file():  # target reference and draft/ inside
            target = target or str(path)
            draft = None if plain else draft or str(path)
        else:  # a plain model directory: the target
            target = target or str(path)
        name = name or path.resolve().name
    if target is None:
        raise ConfigError("no target: pass a BUNDLE or --target")
    return target, draft, name or Path(str(target)).name


def build(args: ServeArgs):
    """Load the models (or start vLLM) and build the app, no server started: (app,
    description, close), ``close`` stopping what the build started (vLLM's servers) where
    the app never ran."""
    require("serve", "draftkit serve")
    if args.front:
        from draftkit.serve.vllm_front import build_front  # optional extra: serve (required above)

        name = args.served_model_name or Path(args.bundle or "").expanduser().resolve().name
        return build_front(args, name)
    app, desc = build_engine(args)
    return app, desc, lambda: None


def build_engine(args: ServeArgs):
    """Load the models and build the app over draftkit's engine: (app, description)."""
    from draftkit.serve.app import create_app  # optional extra: serve (build requires it)

    target, draft, name = resolve_models(args)
    if args.record is not None:  # before the models load: a full folder is refused at once
        check_folder(args.record, int(args.record_quota_mb * MB))
    pair, chosen = load_decoding_pair(target, draft, args.device, args.dtype)
    engine = SpeculativeEngine(pair.target, pair.draft, fast_path=None if args.fast_path
                               else False)
    info = engine.describe()
    max_model_len = args.max_model_len or min(info.context or DEFAULT_MAX_MODEL_LEN,
                                              DEFAULT_MAX_MODEL_LEN)
    k = KChoice.of(args.k, args.k_max, has_draft=info.has_draft)  # validated above
    recorder = open_recorder(args, pair.target_ref, pair.tokenizer) if args.record else None
    app = create_app(engine, pair.tokenizer, model_name=name, k=k, verify=args.verify,
                     max_batch=args.max_batch, max_model_len=max_model_len,
                     max_tokens_limit=args.max_tokens_limit, max_body_bytes=args.max_body_bytes,
                     route_labels=tuple(args.route_labels), recorder=recorder,
                     draft=model_identity(pair.draft_ref) if pair.draft_ref and k.k_max > 0
                     else NO_DRAFT, target_path=str(pair.target_ref.path),
                     admin_token=args.admin_token or os.environ.get(TOKEN_ENV) or None)
    app.state.metrics.eval_figures(eval_domains(args.bundle))
    sched = app.state.scheduler
    info = engine.describe()  # the scheduler's batch has allocated its caches
    batching = "continuous" if info.continuous else "cohorts (general runner)"
    desc = (f"model '{name}': target {pair.target_ref.path}"
            + (f", draft {pair.draft_ref.path} ({sched.draft})" if pair.draft_ref
               else ", no draft")
            + f"; K {sched.k_choice.label}; {args.max_batch} slots x {sched.batch.max_len} "
              f"positions, {batching} batching ({info.kv_cache_bytes / 2**30:.2f} GiB KV cache); "
              f"device {info.device}, {chosen.describe() or chosen.dtype}")
    if recorder is not None:
        desc += (f"; recording into {recorder.folder} ({recorder.used / MB:.1f} of "
                 f"{args.record_quota_mb:g} MB used)")
    return app, desc


def eval_domains(bundle: str | None) -> dict:
    """The eval figures per domain a bundle records (none for a plain model folder)."""
    path = Path(bundle).expanduser() if bundle else None
    if path is None or not (path / MANIFEST).is_file():
        return {}
    return read_manifest(path).domains


def serve(args: ServeArgs) -> None:
    import uvicorn  # optional extra: serve (build requires it)

    class GracefulServer(uvicorn.Server):
        """uvicorn re-raises SIGINT/SIGTERM after its graceful shutdown, so the process would
        die by the signal; a server that shut down cleanly on request exits 0 instead."""

        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list):
                captured.clear()

    app, desc, close = build(args)
    print(f"draftkit serve: {desc}", file=sys.stderr, flush=True)
    print(f"draftkit serve: http://{args.host}:{args.port}/v1 (OpenAI-compatible), /metrics, "
          f"/health" + (", POST /admin/draft (draft swaps)" if app.state.admin.token else ""),
          file=sys.stderr, flush=True)
    log_config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)  # draftkit.serve's lines too
    log_config["loggers"]["draftkit"] = {"handlers": ["default"], "propagate": False,
                                         "level": args.log_level.upper()}
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=args.shutdown_timeout,
                            log_config=log_config)
    server = GracefulServer(config)
    try:
        server.run()
    except SystemExit:  # uvicorn exits 1 when it cannot bind
        server.started = False
    finally:
        close()
    if not server.started:

        raise DraftkitError(f"the server could not start on {args.host}:{args.port} (is the "
                            f"port in use?)")
