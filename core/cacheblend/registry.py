"""One process-wide engine per (model, device, dtype), shared by every integration class.

A vector store that warms chunks and a chat model that answers over them must meet in the same
engine (the same weights, the same memory store); this registry is how they find each other
without the user passing the engine around.
"""

from __future__ import annotations

import threading

from .engine import BlendEngine
from .models import bundled
from .models.loading import resolve_device

_SHARED: dict[tuple, BlendEngine] = {}
_SHARED_LOCK = threading.Lock()


def shared_engine(model: str = bundled.ALIAS, *, device: str = "auto", dtype: str | None = None) -> BlendEngine:
    """The process-wide engine for (model, device, dtype), loaded on first use.

    The LangChain and LlamaIndex classes build their engines through this, so every instance built
    with the same model shares one set of weights and one memory store: a vector store that warms
    chunks and a chat model that answers over them meet in the same engine.
    """
    key = (str(model), resolve_device(device), str(dtype))
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = BlendEngine.from_pretrained(model, device=device, dtype=dtype)
        return _SHARED[key]
