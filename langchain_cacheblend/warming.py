"""Warming: computing each document's KV once, at indexing time, so later prompts reuse it.

``warm_documents`` works with any LangChain vector store and with a text splitter's output:

    chunks = splitter.split_documents(raw_docs)
    store = InMemoryVectorStore.from_documents(warm_documents(chunks), embeddings)

What is warmed is ``page_content``: the text that ``format_docs``-style helpers and
``create_stuff_documents_chain`` put into prompts (a document prompt that adds metadata around it
still contains it). KV keys are content-addressed and kept by the engine, never in metadata.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from langchain_core.documents import Document

from cacheblend import integrations

from .params import resolve_engine

if TYPE_CHECKING:
    from cacheblend import BlendEngine


def warm_texts(
    texts: Iterable[str],
    engine: BlendEngine | str | None = None,
    *,
    store_dir: str | Path | None = None,
    progress: bool | None = None,
    nearest: Callable[[list[str]], Sequence[Sequence[str] | None]] | None = None,
) -> int:
    """Warms ``texts``; returns how many were warmed. Idempotent: stored texts cost nothing.

    Blank and short texts are skipped, and so, with a warning, is a text longer than the model's
    context window (``cacheblend.integrations.warm_fitting``): one bad document never stops the rest
    of its batch. ``store_dir`` also writes the KV to a disk store there. ``nearest``: for an
    engine that warms chunks behind similar passages (``BlendConfig(neighbours=K)``), a function
    giving each text's nearest passages (default: the engine's own choice).
    """
    engine = resolve_engine(engine)
    return len(integrations.warm_fitting(engine, texts, store_dir=store_dir, progress=progress, nearest=nearest))


def warm_documents(
    documents: Iterable[Document],
    engine: BlendEngine | str | None = None,
    *,
    store_dir: str | Path | None = None,
    progress: bool | None = None,
) -> list[Document]:
    """Warms the KV of every document's ``page_content`` and returns the documents unchanged.

    ``engine``: a BlendEngine, a model id (its shared engine) or None (the bundled model's shared
    engine, the one ``ChatCacheBlend()`` uses). A progress bar shows for large batches.
    """
    docs = list(documents)
    warm_texts((d.page_content for d in docs), engine, store_dir=store_dir, progress=progress)
    return docs
