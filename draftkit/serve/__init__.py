"""``draftkit serve``: an OpenAI-compatible HTTP server on the speculative decoder.

The pipeline, one concept per module::

    protocol.py   request bodies (pydantic, unknown fields rejected) and response/chunk bodies
    detok.py      incremental detokenization and stop strings, per request
    scheduler.py  continuous batching: one thread owns the engine, admits between rounds
    metrics.py    Prometheus counters named like vLLM's (prefix ``draftkit:``)
    http.py       the OpenAI error answer, the request body limit, the SSE response
    service.py    a completions request as a scheduler job, and its answer (body or stream)
    swap.py       POST /admin/draft: a new bundle's draft checked, loaded and swapped in
    app.py        the FastAPI app and its routes over a scheduler (tests build it on tiny
                  models)
    command.py    ``ServeArgs`` and ``serve()``: load a bundle and run uvicorn

Only ``command.py`` is imported by ``draftkit --help``; fastapi, uvicorn and
prometheus_client are imported where they are used.
"""
