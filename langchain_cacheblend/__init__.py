"""LangChain integration of cacheblend: CacheBlend KV reuse for RAG chains.

    from langchain_cacheblend import CacheBlendFAISS, ChatCacheBlend

    store = CacheBlendFAISS.from_documents(chunks, embeddings)  # indexes AND warms each chunk's KV
    chain = {"context": store.as_retriever() | format_docs, "question": RunnablePassthrough()} \\
        | prompt | ChatCacheBlend()                              # reuses that KV, in any order

Names are imported lazily: ``import langchain_cacheblend`` does not import torch, FAISS or
sentence-transformers; the engine itself loads on the first call that needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .chat_models import ChatCacheBlend
    from .embeddings import SentenceTransformerEmbeddings
    from .llms import CacheBlendLLM
    from .params import BUNDLED_MODEL
    from .vectorstores import CacheBlendFAISS
    from .warming import warm_documents, warm_texts

_EXPORTS = {
    "ChatCacheBlend": "chat_models",
    "CacheBlendLLM": "llms",
    "CacheBlendFAISS": "vectorstores",
    "warm_documents": "warming",
    "warm_texts": "warming",
    "SentenceTransformerEmbeddings": "embeddings",
    "BUNDLED_MODEL": "params",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
