"""CacheBlendFAISS: LangChain's FAISS vector store that also warms each document's KV.

Everything FAISS does is unchanged (search, retrievers, filters, ``delete``, ids, metadata); every
way of adding documents (``from_documents``, ``from_texts``, ``from_embeddings``, ``add_documents``,
``add_texts``, ``add_embeddings``, ``merge_from`` and their async forms) additionally warms the
KV of each ``page_content`` in the engine, so a ``ChatCacheBlend`` on the same model reuses it.

On disk, ``save_local(folder)`` writes FAISS's own ``index.faiss`` + ``index.pkl`` and then the KV
store under ``folder/cacheblend/`` (safetensors files, a text catalogue, and a small JSON
manifest naming the model): no pickle of ours, no KV keys in any document's metadata.
``load_local`` reads both and attaches the KV store, computing nothing that is already there.
Documents whose KV is missing (an index saved by plain FAISS, a save interrupted before the KV
was written, a different model) are warmed on load with a warning, or, with
``warm_missing=False``, left to be computed at query time. Deleting documents leaves their KV on
disk (content-addressed, harmless, never reused for other text).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from langchain_community.vectorstores import FAISS
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.runnables.config import run_in_executor

from cacheblend.integrations import KV_DIR, WarmCap, read_json, unstored_texts, warmable, write_json

from .params import resolve_engine
from .warming import warm_texts

if TYPE_CHECKING:
    from cacheblend import BlendEngine

Metas = Iterable[dict] | None  # FAISS's own parameter types, named once
Ids = list[str] | None
Pairs = Iterable[tuple[str, list[float]]]
MANIFEST_FORMAT = 1


class CacheBlendFAISS(FAISS):
    """FAISS whose additions warm KV; ``save_local``/``load_local`` carry the KV store along.

    Extra keyword arguments (accepted by every constructor path, e.g.
    ``CacheBlendFAISS.from_documents(docs, embeddings, engine="smollm2-135m-instruct")``):

    engine: a BlendEngine, a model id (its process-wide shared engine) or None (the bundled
        model). Use the model your ``ChatCacheBlend`` uses so both meet in one engine.
    kv_dir: write KV to this disk store as it is computed (large corpora: the memory store has a
        byte budget, and disk keeps what it evicts); default memory only until ``save_local``.
    warm_limit: warm only the first N documents added (0: none; default: all); the others are
        warmed on miss, after the first answer that retrieves them (``cacheblend.integrations.WarmCap``).
    """

    def __init__(
        self,
        *args: Any,
        engine: BlendEngine | str | None = None,
        kv_dir: str | os.PathLike | None = None,
        warm_limit: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._engine_spec = engine
        self._engine: BlendEngine | None = None
        self.kv_dir = Path(kv_dir) if kv_dir is not None else None
        self._cap = WarmCap(warm_limit)

    @property
    def engine(self) -> BlendEngine:
        """The engine KV is warmed in (loaded on first use)."""
        if self._engine is None:
            self._engine = resolve_engine(self._engine_spec)
        return self._engine

    def warm(self, texts: Iterable[str], store_dir: str | os.PathLike | None = None) -> int:
        """Warms ``texts`` in this store's engine (and ``store_dir``, default ``kv_dir``); returns how
        many. An engine that warms chunks behind similar passages (``BlendConfig(neighbours=K)``)
        gets each document's nearest documents by this index's own vectors and distance."""
        texts = self._cap.split(self.engine, texts)
        return warm_texts(texts, self.engine, store_dir=store_dir or self.kv_dir, nearest=self.nearest_texts)

    def nearest_texts(self, texts: list[str]) -> list[list[str] | None]:
        """For each text, the ``page_content`` of its ``engine.kv.neighbours`` nearest other
        documents in this index (what a retriever returns beside it), nearest first; None for a text
        the index does not hold or cannot give back a vector for (the engine then picks)."""
        k = self.engine.kv.neighbours
        content = {pos: doc.page_content for pos, doc in self._docs_by_position().items()}
        where: dict[str, int] = {}
        for pos, text in content.items():
            where.setdefault(text.strip(), pos)
        known = sorted({where[t.strip()] for t in texts if t.strip() in where})
        if not k or not known:
            return [None] * len(texts)
        try:
            vectors = np.stack([self.index.reconstruct(pos) for pos in known])  # [n, dim]
        except RuntimeError:  # an index type that keeps no vectors to give back
            return [None] * len(texts)
        _, found = self.index.search(vectors, min(self.index.ntotal, k + 4))  # [n, k + 4]: room for copies
        near = {}
        for pos, hits in zip(known, found.tolist()):
            own = content[pos].strip()
            others = [content[h] for h in hits if h in content and content[h].strip() != own]
            near[pos] = list(dict.fromkeys(others))[:k]
        return [near[where[t.strip()]] if t.strip() in where else None for t in texts]

    def _docs_by_position(self) -> dict[int, Document]:
        """FAISS row -> its document."""
        docs = {pos: self.docstore.search(i) for pos, i in self.index_to_docstore_id.items()}
        return {pos: d for pos, d in docs.items() if isinstance(d, Document)}

    def documents(self) -> list[Document]:
        """Every document in the index, in index order."""
        return list(self._docs_by_position().values())

    # -- adding: FAISS first (it validates), then warming --------------------------------------
    def add_texts(self, texts: Iterable[str], metadatas: Metas = None, ids: Ids = None, **kwargs: Any) -> list:
        texts = list(texts)
        added = super().add_texts(texts, metadatas=metadatas, ids=ids, **kwargs)
        self.warm(texts)
        return added

    async def aadd_texts(self, texts: Iterable[str], metadatas: Metas = None, ids: Ids = None, **kwargs: Any) -> list:
        texts = list(texts)
        added = await super().aadd_texts(texts, metadatas=metadatas, ids=ids, **kwargs)
        await run_in_executor(None, self.warm, texts)
        return added

    def add_embeddings(self, text_embeddings: Pairs, metadatas: Metas = None, ids: Ids = None, **kwargs: Any) -> list:
        pairs = list(text_embeddings)
        added = super().add_embeddings(pairs, metadatas=metadatas, ids=ids, **kwargs)
        self.warm(t for t, _ in pairs)
        return added

    def merge_from(self, target: FAISS) -> None:
        super().merge_from(target)
        docs = (target.docstore.search(i) for i in target.index_to_docstore_id.values())
        self.warm(d.page_content for d in docs if isinstance(d, Document))

    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings, metadatas: Metas = None, ids: Ids = None,
                   **kwargs: Any) -> CacheBlendFAISS:
        texts = list(texts)
        store = super().from_texts(texts, embedding, metadatas=metadatas, ids=ids, **kwargs)
        store.warm(texts)
        return store

    @classmethod
    async def afrom_texts(cls, texts: list[str], embedding: Embeddings, metadatas: Metas = None, ids: Ids = None,
                          **kwargs: Any) -> CacheBlendFAISS:
        texts = list(texts)
        store = await super().afrom_texts(texts, embedding, metadatas=metadatas, ids=ids, **kwargs)
        await run_in_executor(None, store.warm, texts)
        return store

    @classmethod
    def from_embeddings(cls, text_embeddings: Pairs, embedding: Embeddings, metadatas: Metas = None, ids: Ids = None,
                        **kwargs: Any) -> CacheBlendFAISS:
        pairs = list(text_embeddings)
        store = super().from_embeddings(pairs, embedding, metadatas=metadatas, ids=ids, **kwargs)
        store.warm(t for t, _ in pairs)
        return store

    @classmethod
    async def afrom_embeddings(cls, text_embeddings: Pairs, embedding: Embeddings, metadatas: Metas = None,
                               ids: Ids = None, **kwargs: Any) -> CacheBlendFAISS:
        # FAISS's own version runs the sync one on the event loop; warming must not.
        return await run_in_executor(
            None, lambda: cls.from_embeddings(text_embeddings, embedding, metadatas=metadatas, ids=ids, **kwargs)
        )

    @classmethod
    def deserialize_from_bytes(cls, serialized: bytes, embeddings: Embeddings, **kwargs: Any) -> CacheBlendFAISS:
        """FAISS's byte form holds no KV: the documents are warmed again (stored ones cost nothing)."""
        store = super().deserialize_from_bytes(serialized, embeddings, **kwargs)
        store.warm(d.page_content for d in store.documents())
        return store

    # -- persistence -----------------------------------------------------------------------------
    def save_local(self, folder_path: str | os.PathLike, index_name: str = "index") -> None:
        """FAISS's files, then the KV of every document in ``folder_path/cacheblend/``, then the
        manifest (written last: its presence says the KV store was completed)."""
        super().save_local(str(folder_path), index_name)
        kv_dir = Path(folder_path) / KV_DIR
        texts = [d.page_content for d in self.documents()]
        if self._cap.limit is None:
            self.warm(texts, store_dir=kv_dir)
        else:  # capped: what is stored so far is copied (nothing computed); the rest stays warm-on-miss
            warm_texts([t for t in warmable(texts) if self.engine.kv.is_warm(t.strip())], self.engine, store_dir=kv_dir)
        write_json(kv_dir / f"{index_name}.json", {
            "format": MANIFEST_FORMAT,
            "model": self.engine.name,
            "documents": len(warmable(texts)),
        })

    @classmethod
    def load_local(
        cls,
        folder_path: str | os.PathLike,
        embeddings: Embeddings,
        index_name: str = "index",
        *,
        allow_dangerous_deserialization: bool = False,
        warm_missing: bool = True,
        **kwargs: Any,
    ) -> CacheBlendFAISS:
        """Loads the FAISS index and attaches its KV store (nothing stored is recomputed).

        The engine is ``engine=`` if given, else the model named in the manifest, else the
        bundled model. ``allow_dangerous_deserialization`` is FAISS's own switch for its
        ``index.pkl`` (our KV files are safetensors and need no such trust). Documents without
        stored KV are warmed now with a warning (``warm_missing=False``: computed at query time).
        """
        folder = Path(folder_path)
        for name in (f"{index_name}.faiss", f"{index_name}.pkl"):
            if not (folder / name).is_file():
                raise FileNotFoundError(
                    f"{folder / name} is missing: {folder} holds no complete FAISS index named {index_name!r} "
                    "(wrong folder or index_name, or save_local was interrupted; save it again)"
                )
        kv_dir = folder / KV_DIR
        if kwargs.get("engine") is None:
            kwargs["engine"] = read_json(kv_dir / f"{index_name}.json").get("model")
        store = super().load_local(
            str(folder), embeddings, index_name, allow_dangerous_deserialization=allow_dangerous_deserialization,
            **kwargs,
        )
        store.attach_kv(kv_dir, warm_missing=warm_missing)
        return store

    def attach_kv(self, kv_dir: str | os.PathLike, *, warm_missing: bool = True) -> int:
        """Makes the KV store at ``kv_dir`` readable; returns how many documents it lacked.

        Which documents are stored is read from the store's text catalogue (no KV is loaded and
        nothing is tokenized for the ones present).
        """
        missing = unstored_texts(self.engine, kv_dir, (d.page_content for d in self.documents()))
        if missing:
            action = "warming them now" if warm_missing else "they will be computed at query time"
            warnings.warn(
                f"{len(missing)} document(s) have no KV stored in {kv_dir} for model {self.engine.name!r} "
                f"(index saved without it, save interrupted, or another model); {action}",
                UserWarning,
                stacklevel=3,
            )
            if warm_missing:
                self.warm(missing, store_dir=kv_dir)
        return len(missing)
