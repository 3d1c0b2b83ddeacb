"""Models: the transformers adapter, loading, and the offline models installed from PyPI.

``adapter.py`` is the only module that touches transformers internals. A new model family is a
small ``ModelAdapter`` subclass there (override the hooks that differ, e.g. ``_norm_q``/``_norm_k``
for q/k norms) registered in ``_ADAPTERS`` and described in ``SUPPORTED``.

``catalog.py`` lists the models that install as GGUF from pip packages (alias, packages pinned,
checksums) and assembles and verifies their files; ``bundled.py`` converts each once to
safetensors under the cache directory; ``loading.py`` turns an alias, a HF id or folder, or a
``.gguf`` path into a model and tokenizer on a device. Imports run one way: catalog <- bundled <-
loading.
"""
