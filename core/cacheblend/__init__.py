"""cacheblend: CacheBlend-style KV cache reuse for RAG.

Each retrieved chunk's KV cache is computed once, when it is indexed; at query time the chunks are
assembled in any order, their cached keys realigned to their new positions, the ~15% of tokens
whose KV deviates most are recomputed (plus every uncached token), and decoding starts from the
blended cache.

Names load on first use: ``import cacheblend`` (or ``cacheblend.integrations``) imports neither
torch nor transformers, so the LangChain and LlamaIndex packages stay cheap to import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from .generation.decode import GenerationStream, Prefilled
    from .models.adapter import SUPPORTED as SUPPORTED_MODELS
    from .models.adapter import UnsupportedModelError
    from .models.bundled import ALIAS as BUNDLED_MODEL
    from .prompts.finder import ChunkFinder
    from .registry import shared_engine
    from .result import BlendStats, Generation
    from .stores import ChunkRecord, DiskStore, MemoryStore, StoreChain, StoreWarning

__version__ = "0.1.0"

# public name -> (module, name in that module)
_EXPORTS = {
    "AllSelector": ("blending.selection", "AllSelector"),
    "BUNDLED_MODEL": ("models.bundled", "ALIAS"),
    "BlendConfig": ("config", "BlendConfig"),
    "BlendEngine": ("engine", "BlendEngine"),
    "BlendStats": ("result", "BlendStats"),
    "Candidates": ("blending.selection", "Candidates"),
    "ChunkFinder": ("prompts.finder", "ChunkFinder"),
    "ChunkRecord": ("stores", "ChunkRecord"),
    "ChunkStartSelector": ("blending.selection", "ChunkStartSelector"),
    "DeviationSelector": ("blending.selection", "DeviationSelector"),
    "DiskStore": ("stores", "DiskStore"),
    "Generation": ("result", "Generation"),
    "GenerationStream": ("generation.decode", "GenerationStream"),
    "MemoryStore": ("stores", "MemoryStore"),
    "NoneSelector": ("blending.selection", "NoneSelector"),
    "Prefilled": ("generation.decode", "Prefilled"),
    "RandomSelector": ("blending.selection", "RandomSelector"),
    "SUPPORTED_MODELS": ("models.adapter", "SUPPORTED"),
    "Selector": ("blending.selection", "Selector"),
    "StoreChain": ("stores", "StoreChain"),
    "StoreWarning": ("stores", "StoreWarning"),
    "UnsupportedModelError": ("models.adapter", "UnsupportedModelError"),
    "shared_engine": ("registry", "shared_engine"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = getattr(importlib.import_module(f".{module}", __name__), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
