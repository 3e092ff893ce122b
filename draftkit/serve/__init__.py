"""``draftkit serve``: an OpenAI-compatible HTTP server on the speculative decoder, or in front of
vLLM.

The pipeline, one concept per module::

    protocol.py    request bodies (pydantic, unknown fields rejected) and response/chunk bodies
    detok.py       incremental detokenization and stop strings, per request
    scheduler.py   continuous batching: one thread owns the engine, admits between rounds
    metrics.py     Prometheus counters named like vLLM's (prefix ``draftkit:``)
    http.py        the OpenAI error answer, the request body limit, the SSE response
    service.py     a completions request as a scheduler job, and its answer (body or stream)
    swap.py        POST /admin/draft: its token, and the built-in engine's swap
    app.py         the FastAPI app and its routes, over the scheduler or over vLLM (tests
                   build it on tiny models and on stand-in upstreams)
    args.py        ``ServeArgs``, the command's flags
    command.py     ``serve()``: load a bundle (or start vLLM), run uvicorn

In front of vLLM (``--engine vllm``, ``--upstream``), the same app over other pieces::

    replicas.py    vLLM's own OpenAI servers, started with the bundle's preflight
    upstream.py    the pool of vLLM servers: least-busy routing, health
    proxy.py       a completions request passed to the pool, its answer back, its record
    vllm_request.py a request's body, what the front adds and hides, its sampling
    vllm_answer.py what vLLM's answers hold (ids, per-step counts, SSE events), checked
    vllm_swap.py   POST /admin/draft over the replicas: blue/green with a canary
    vllm_front.py  the command's build of it all

``draftkit serve --help`` imports ``args.py`` alone. The web stack (fastapi, uvicorn, httpx,
prometheus_client) is the ``serve`` extra: ``command.py`` checks it is installed before it
imports the modules that need it (app.py, vllm_front.py) inside its functions, and metrics.py
imports prometheus_client inside its own.
"""
