"""One process-wide engine per model, device and dtype, however each is spelled.

A vector store that warms chunks and a chat model that answers over them must meet in the same
engine (the same weights, the same memory store); this registry is how they find each other
without the user passing the engine around. The key is normalised, so a warmer built with
an alias (``"smollm2-135m-instruct"``, ``"qwen2.5-0.5b-instruct"``, ``"gemma3-270m"``) and an LLM
built with the converted folder's path, ``device="auto"`` vs ``"cpu"``, or ``dtype=None`` vs
``"float32"`` share one engine.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from .engine import BlendEngine
from .models import bundled, catalog
from .models.loading import resolve_device, resolve_dtype

_SHARED: dict[tuple[str, str, str], BlendEngine] = {}
_SHARED_LOCK = threading.Lock()


def engine_key(model: str, device: str = "auto", dtype: str | torch.dtype | None = None) -> tuple[str, str, str]:
    """(model, device, dtype) in one spelling: a catalogue alias for its converted folder (or its
    installed GGUF when it ships whole), absolute paths for other local folders and files,
    ``cuda:N`` for ``cuda``, the resolved dtype."""
    dev = resolve_device(device)
    if dev == "cuda":
        dev = f"cuda:{torch.cuda.current_device()}"
    return _model_name(str(model)), dev, str(resolve_dtype(dtype, dev)).removeprefix("torch.")


def _model_name(model: str) -> str:
    if model in catalog.MODELS:
        return model
    path = Path(model).expanduser()
    if not path.exists():
        return model  # a hub id
    return bundled.alias_of(path) or str(path.resolve())


def shared_engine(model: str = bundled.ALIAS, *, device: str = "auto", dtype: str | None = None) -> BlendEngine:
    """The process-wide engine for (model, device, dtype), loaded on first use.

    The LangChain and LlamaIndex classes build their engines through this, so every instance built
    with the same model shares one set of weights and one memory store.
    """
    key = engine_key(model, device, dtype)
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = BlendEngine.from_pretrained(key[0], device=key[1], dtype=key[2])
        return _SHARED[key]
