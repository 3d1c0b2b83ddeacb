"""Models: the transformers adapter, loading, and the bundled offline model.

``adapter.py`` is the only module that touches transformers internals. A new model family is a
small ``ModelAdapter`` subclass there (override the hooks that differ, e.g. ``_norm_q``/``_norm_k``
for q/k norms) registered in ``_ADAPTERS`` and described in ``SUPPORTED``.
"""
