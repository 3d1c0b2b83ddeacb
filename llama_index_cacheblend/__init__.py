"""LlamaIndex integration of cacheblend: reuse each retrieved node's KV cache at query time.

- ``CacheBlendLLM``: a LlamaIndex LLM over a cacheblend engine (complete/chat, streaming, async).
- ``KVCacheWarmer``: an ingestion transform that warms the KV of each node's prompt text.
- ``WholeChunkSynthesizer``: one answer call over whole nodes (never re-split, never truncated).
- ``persist_index`` / ``load_faiss_index``: a FAISS index and its KV store, side by side.
- ``BlendStatsHandler``: the reuse statistics of the LLM calls a query engine makes.
"""

from .embeddings import SentenceTransformerEmbedding
from .llm import CacheBlendLLM, ChatTemplate, blend_stats, usage_raw
from .stats import BlendStatsHandler, LLMCall, record_blend_stats
from .storage import (
    KV_SUBDIR,
    ForeignKVStoreWarning,
    attach_kv_store,
    faiss_storage_context,
    kv_store_dir,
    load_faiss_index,
    persist_index,
)
from .synthesizer import DroppedNodesWarning, WholeChunkSynthesizer
from .warmer import KVCacheWarmer, SkippedNodeWarning, llm_texts

__all__ = [
    "BlendStatsHandler",
    "CacheBlendLLM",
    "ChatTemplate",
    "DroppedNodesWarning",
    "ForeignKVStoreWarning",
    "KVCacheWarmer",
    "KV_SUBDIR",
    "LLMCall",
    "SentenceTransformerEmbedding",
    "SkippedNodeWarning",
    "WholeChunkSynthesizer",
    "attach_kv_store",
    "blend_stats",
    "faiss_storage_context",
    "kv_store_dir",
    "llm_texts",
    "load_faiss_index",
    "persist_index",
    "record_blend_stats",
    "usage_raw",
]
