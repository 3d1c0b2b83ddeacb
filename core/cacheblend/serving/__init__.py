"""Serving: the OpenAI-compatible HTTP server goes here (issue 12).

An endpoint is a module here over ``BlendEngine`` (no engine internals): it maps a request to
``engine.stream``/``generate`` and ``BlendStats`` to the response's usage with
``cacheblend.integrations.Usage`` (``usage.prompt_tokens_details.cached_tokens``).
"""
