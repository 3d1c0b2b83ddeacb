"""Warming: computing each document's KV once, at indexing time, so later prompts reuse it.

``warm_documents`` works with any LangChain vector store and with a text splitter's output:

    chunks = splitter.split_documents(raw_docs)
    store = InMemoryVectorStore.from_documents(warm_documents(chunks), embeddings)

What is warmed is ``page_content``: the text that ``format_docs``-style helpers and
``create_stuff_documents_chain`` put into prompts (a document prompt that adds metadata around it
still contains it). KV keys are content-addressed and kept by the engine, never in metadata.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from langchain_core.documents import Document

from .params import resolve_engine

if TYPE_CHECKING:
    from cacheblend import BlendEngine


# Shorter texts are not warmed. They are a few tokens (nothing to save), and the engine finds
# warmed texts wherever they stand in a prompt as whole words: a warmed "bar" would be cut out of
# every later prompt saying "the bar is open", changing that prompt's tokenization (" bar" is one
# token in running text, "bar" after a separate " " is two).
MIN_CHARS = 32


def warmable(texts: Iterable[str]) -> list[str]:
    """The texts worth warming: at least ``MIN_CHARS`` characters after stripping."""
    return [t for t in texts if isinstance(t, str) and len(t.strip()) >= MIN_CHARS]


def warm_texts(
    texts: Iterable[str],
    engine: BlendEngine | str | None = None,
    *,
    store_dir: str | Path | None = None,
    progress: bool | None = None,
) -> int:
    """Warms ``texts`` (skipping blank and very short ones); returns how many were warmed.

    The engine validates every text before computing anything, so one text longer than the
    model's context window would stop the whole batch; such texts are skipped one by one with a
    warning instead (a prompt could never hold them whole, and a partial copy is never reused).
    ``store_dir`` also writes the KV to a disk store there. Idempotent: stored texts cost nothing.
    """
    engine = resolve_engine(engine)
    todo = warmable(texts)
    if not todo:
        return 0
    try:
        engine.warm(todo, store_dir=store_dir, progress=progress)
        return len(todo)
    except ValueError:
        return _warm_one_by_one(engine, todo, store_dir)


def _warm_one_by_one(engine: BlendEngine, texts: Sequence[str], store_dir: str | Path | None) -> int:
    warmed = 0
    for text in texts:
        try:
            engine.warm([text], store_dir=store_dir, progress=False)
            warmed += 1
        except ValueError as exc:
            warnings.warn(f"not warming a document: {exc}", UserWarning, stacklevel=3)
    return warmed


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
