"""What the LangChain and LlamaIndex integrations share, once (their only door into the core
besides ``cacheblend``'s own public names).

- ``EngineFields``: the model and sampling fields of every framework LLM class (pydantic mixin).
- ``Usage``: BlendStats as token usage (OpenAI's shape via ``.openai()``; cached tokens).
- ``iterate_in_thread``: the async bridge from a blocking engine stream to an event loop;
  ``interleave``: several streams read in turn, so that their answers share decode steps.
- ``SentenceEncoder`` / ``bundled_embedding_path``: offline sentence embeddings.
- ``warm_fitting`` / ``warmable`` / ``MIN_CHARS`` / ``ChunkTooLongWarning``: how an index warms
  what it adds (short texts skipped, over-long ones skipped with a warning, never a lost batch);
  ``WarmCap``: index-time warming capped at the first N texts, the rest warmed on miss.
- ``KV_DIR`` / ``kv_store_dir`` / ``unstored_texts`` / ``write_json`` / ``read_json``: the KV
  store beside a persisted index.
- ``lazy_exports``: public names that load on first use (how these packages stay torch-free).

Names load on first use; none of them imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from .embeddings import SentenceEncoder, bundled_embedding_path
    from .fields import EngineFields
    from .persistence import KV_DIR, kv_store_dir, read_json, unstored_texts, write_json
    from .threads import interleave, iterate_in_thread
    from .usage import Usage
    from .warming import MIN_CHARS, ChunkTooLongWarning, WarmCap, warm_fitting, warmable

_EXPORTS = {
    "ChunkTooLongWarning": "warming",
    "EngineFields": "fields",
    "KV_DIR": "persistence",
    "MIN_CHARS": "warming",
    "SentenceEncoder": "embeddings",
    "Usage": "usage",
    "WarmCap": "warming",
    "bundled_embedding_path": "embeddings",
    "interleave": "threads",
    "iterate_in_thread": "threads",
    "kv_store_dir": "persistence",
    "read_json": "persistence",
    "unstored_texts": "persistence",
    "warm_fitting": "warming",
    "warmable": "warming",
    "write_json": "persistence",
}

__all__ = sorted([*_EXPORTS, "lazy_exports"])
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
