"""The OpenAI-compatible server (``cacheblend serve``): chunk KV blending and continuous batching.

    from cacheblend.serving import SchedulerLimits, create_app, serve
    serve(create_app(engine, store_dir="kv", limits=SchedulerLimits(max_batch=8)), host="127.0.0.1", port=8000)

Modules: ``app`` (routes), ``protocol`` (request validation, OpenAI errors), ``responses`` (bodies,
SSE chunks), ``scheduler`` (the model thread: queue, admission, batched steps), ``batch`` (slot KV
buffers and the batched decode forward), ``metrics`` (Prometheus text), ``openapi`` (the schema's bodies), ``command`` (what runs
``cacheblend serve``; its arguments are in ``cacheblend.cliargs``).
Needs the ``serve`` extra (FastAPI, uvicorn); names load on first use, so ``cacheblend --help``
imports none of it.
"""

from ..lazy import lazy_exports

_EXPORTS = {"SchedulerLimits": "app", "create_app": "app", "serve": "app"}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
