"""cacheblend: CacheBlend-style KV cache reuse for RAG.

Each retrieved chunk's KV cache is computed once, when it is indexed; at query time the chunks are
assembled in any order, their cached keys realigned to their new positions, the ~15% of tokens
whose KV deviates most are recomputed (plus every uncached token), and decoding starts from the
blended cache.
"""

from .bundled import ALIAS as BUNDLED_MODEL
from .config import BlendConfig
from .engine import BlendEngine, GenerationStream, Prefilled, shared_engine
from .finder import ChunkFinder
from .models import SUPPORTED as SUPPORTED_MODELS
from .models import UnsupportedModelError
from .result import BlendStats, Generation
from .selection import (
    AllSelector,
    Candidates,
    ChunkStartSelector,
    DeviationSelector,
    NoneSelector,
    RandomSelector,
    Selector,
)
from .store import ChunkKV, DiskStore, KVStore, MemoryStore, StoreChain, StoreWarning

__version__ = "0.1.0"

__all__ = [
    "AllSelector",
    "BUNDLED_MODEL",
    "BlendConfig",
    "BlendEngine",
    "BlendStats",
    "Candidates",
    "ChunkFinder",
    "ChunkKV",
    "ChunkStartSelector",
    "DeviationSelector",
    "DiskStore",
    "Generation",
    "GenerationStream",
    "KVStore",
    "MemoryStore",
    "NoneSelector",
    "Prefilled",
    "RandomSelector",
    "SUPPORTED_MODELS",
    "Selector",
    "StoreChain",
    "StoreWarning",
    "UnsupportedModelError",
    "shared_engine",
]
