"""``draftkit serve``: an OpenAI-compatible HTTP server on the speculative decoder.

The pipeline, one concept per module::

    protocol.py   request bodies (pydantic, unknown fields rejected) and response/chunk bodies
    detok.py      incremental detokenization and stop strings, per request
    scheduler.py  continuous batching: one thread owns the engine, admits between rounds
    metrics.py    Prometheus counters named like vLLM's (prefix ``draftkit:``)
    app.py        the FastAPI app over a scheduler (tests build it on tiny models)
    command.py    ``ServeArgs`` and ``serve()``: load a bundle and run uvicorn

Only ``command.py`` is imported by ``draftkit --help``; fastapi, uvicorn and
prometheus_client are imported where they are used.
"""
