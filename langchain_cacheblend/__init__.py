"""LangChain integration of cacheblend: CacheBlend KV reuse for RAG chains.

    from langchain_cacheblend import CacheBlendFAISS, ChatCacheBlend

    store = CacheBlendFAISS.from_documents(chunks, embeddings)  # indexes AND warms each chunk's KV
    chain = {"context": store.as_retriever() | format_docs, "question": RunnablePassthrough()} \\
        | prompt | ChatCacheBlend()                              # reuses that KV, in any order

Names are imported lazily: ``import langchain_cacheblend`` does not import torch, FAISS or
sentence-transformers; the engine itself loads on the first call that needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cacheblend.integrations import lazy_exports

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
    "BUNDLED_MODEL": "params",  # cacheblend.BUNDLED_MODEL, re-exported
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
