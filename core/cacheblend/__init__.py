"""cacheblend: CacheBlend-style KV cache reuse for RAG.

Each retrieved chunk's KV cache is computed once, when it is indexed; at query time the chunks are
assembled in any order, their cached keys realigned to their new positions, the ~15% of tokens
whose KV deviates most are recomputed (plus every uncached token), and decoding starts from the
blended cache.

Names load on first use: ``import cacheblend`` (or ``cacheblend.integrations``) imports neither
torch nor transformers, so the LangChain and LlamaIndex packages stay cheap to import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_exports

if TYPE_CHECKING:
    from .blending.lexical import LexicalSelector
    from .blending.selection import (
        AllSelector,
        Candidates,
        ChunkStartSelector,
        DeviationSelector,
        NoneSelector,
        RandomSelector,
        Selector,
    )
    from .config import BlendConfig
    from .engine import BlendEngine
    from .generation.decode import Prefilled
    from .generation.stream import GenerationStream
    from .models.adapter import SUPPORTED as SUPPORTED_MODELS
    from .models.adapter import UnsupportedModelError
    from .models.bundled import ALIAS as BUNDLED_MODEL
    from .prompts.finder import ChunkFinder
    from .prompts.prepared import ContextLengthError, Request
    from .registry import shared_engine
    from .result import BlendStats, Generation
    from .stores import ChunkRecord, DiskStore, KVTier, MemoryStore, RedisStore, StoreChain, StoreWarning

__version__ = "0.1.0"

# public name -> the module defining it (":name" where it is named differently there)
_EXPORTS = {
    "AllSelector": "blending.selection",
    "BUNDLED_MODEL": "models.bundled:ALIAS",
    "BlendConfig": "config",
    "BlendEngine": "engine",
    "BlendStats": "result",
    "Candidates": "blending.selection",
    "ChunkFinder": "prompts.finder",
    "ChunkRecord": "stores",
    "ChunkStartSelector": "blending.selection",
    "ContextLengthError": "prompts.prepared",
    "DeviationSelector": "blending.selection",
    "DiskStore": "stores",
    "Generation": "result",
    "GenerationStream": "generation.stream",
    "KVTier": "stores",
    "LexicalSelector": "blending.lexical",
    "MemoryStore": "stores",
    "NoneSelector": "blending.selection",
    "Prefilled": "generation.decode",
    "RandomSelector": "blending.selection",
    "RedisStore": "stores",
    "Request": "prompts.prepared",
    "SUPPORTED_MODELS": "models.adapter:SUPPORTED",
    "Selector": "blending.selection",
    "StoreChain": "stores",
    "StoreWarning": "stores",
    "UnsupportedModelError": "models.adapter",
    "shared_engine": "registry",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
