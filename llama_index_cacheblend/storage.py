"""Persisting a FAISS-backed index together with its chunk KV, and loading both back.

Layout of a persisted index:

    <persist_dir>/default__vector_store.json   FAISS index (FaissVectorStore.persist)
    <persist_dir>/docstore.json, index_store.json, ...   LlamaIndex storage context
    <persist_dir>/cacheblend/<fingerprint[:16]>/...       chunk KV (safetensors) + catalogue

The KV store is scoped by model fingerprint, so one index directory can hold the KV of several
models. Loading attaches the store to the engine (it reads KV lazily and learns the chunk texts
from the catalogue): nothing is recomputed. A store holding only another model's KV is not an
error: every chunk is computed at query time (correct, slower) and a ``ForeignKVStoreWarning``
says how to re-warm.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cacheblend
from cacheblend.integrations import KV_DIR, kv_store_dir, warm_fitting
from llama_index.core import StorageContext, VectorStoreIndex, load_index_from_storage
from llama_index.core.indices.base import BaseIndex

from .warmer import llm_texts

if TYPE_CHECKING:  # the engine (and torch) load with the first model, not with this package
    from cacheblend import BlendEngine, DiskStore

KV_SUBDIR = KV_DIR  # this package's public name for it


class ForeignKVStoreWarning(UserWarning):
    """The index's KV store holds no KV for this model; chunks are computed until re-warmed."""


def faiss_storage_context(dimension: int, metric: str = "ip") -> StorageContext:
    """A fresh StorageContext over an exact FAISS index (``ip``: cosine for normalised vectors)."""
    import faiss
    from llama_index.vector_stores.faiss import FaissVectorStore

    if metric not in ("ip", "l2"):
        raise ValueError(f"metric must be 'ip' or 'l2', got {metric!r}")
    index = faiss.IndexFlatIP(dimension) if metric == "ip" else faiss.IndexFlatL2(dimension)
    return StorageContext.from_defaults(vector_store=FaissVectorStore(faiss_index=index))


def persist_index(
    index: BaseIndex, persist_dir: str | Path, engine: BlendEngine | None = None, *, progress: bool | None = None
) -> Path:
    """``index.storage_context.persist(persist_dir)`` plus the KV of every node in its docstore.

    KV already in ``<persist_dir>/cacheblend`` (a warmer with that ``store_dir``) costs nothing;
    KV held in memory is copied there; anything else (evicted, never warmed) is computed.
    ``engine``: the engine whose KV to persist (``llm.engine``); default: the bundled model.
    Returns the KV store directory.
    """
    engine = engine or cacheblend.shared_engine()
    persist_dir = Path(persist_dir)
    index.storage_context.persist(persist_dir=str(persist_dir))
    warm_fitting(engine, llm_texts(index.docstore.docs.values()), store_dir=kv_store_dir(persist_dir), progress=progress)
    return kv_store_dir(persist_dir)


def attach_kv_store(persist_dir: str | Path, engine: BlendEngine | None = None) -> DiskStore:
    """Makes the KV persisted beside an index readable by ``engine`` (no compute, no copy)."""
    engine = engine or cacheblend.shared_engine()
    root = kv_store_dir(persist_dir)
    disk = engine.attach_store(root)
    if not disk.dir.is_dir():
        from cacheblend.stores import DiskStore

        others = DiskStore.fingerprints(root)
        held = f"it holds KV for other model fingerprints {others}" if others else "it is empty"
        warnings.warn(
            f"no KV for {engine.name} (fingerprint {engine.kv.fingerprint[:16]}) under {root}: {held}; "
            "chunks will be computed at query time; persist_index(index, persist_dir, engine) re-warms them",
            ForeignKVStoreWarning,
            2,
        )
    return disk


def load_faiss_index(
    persist_dir: str | Path, embed_model: Any, engine: BlendEngine | None = None, **index_kwargs: Any
) -> VectorStoreIndex:
    """Loads an index persisted with a FaissVectorStore and attaches its KV store.

    ``index_kwargs`` go to ``load_index_from_storage`` (e.g. ``transformations=[splitter,
    KVCacheWarmer(store_dir=kv_store_dir(persist_dir))]`` so that ``index.insert`` keeps warming).
    """
    from llama_index.vector_stores.faiss import FaissVectorStore

    persist_dir = str(persist_dir)
    vector_store = FaissVectorStore.from_persist_dir(persist_dir)
    context = StorageContext.from_defaults(vector_store=vector_store, persist_dir=persist_dir)
    index = load_index_from_storage(context, embed_model=embed_model, **index_kwargs)
    attach_kv_store(persist_dir, engine)
    return index
