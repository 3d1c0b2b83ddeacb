"""The prompt's head, computed once: the exact K/V of the tokens before its first chunk.

The requests of one application start alike: the chat template's header, a system prompt, the
instructions before the retrieved passages. Nothing precedes those tokens, so their K/V depend on
their ids alone and a full prefill computes the same values on every request (prefix caching's
premise). ``HeadCache`` keeps them per head (keyed by its ids), computed the first time a head is
seen (a forward of those ids alone, in the compute dtype) and kept by recency within a byte budget;
``with_head`` gives a ``BlendInput`` its head, which the blend reads and never computes past its
first check layer (``blend.py``). Only a prompt that reuses some chunk gets one (a prompt that
reuses none is a full prefill). Its head is its tokens before its first chunk (``Request.head_tokens``),
never past the first reused row: a first chunk that missed is not part of the head's key.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace

import torch

from ..models.adapter import ModelAdapter
from .blend import BlendInput, blend_prefill
from .selection import NoneSelector

DEFAULT_BYTES = 64 << 20


class HeadCache:
    """Heads' exact K/V by their ids, most recently used kept within ``max_bytes`` (0: off, every
    prompt computes its head as before). A head larger than the budget is used once, not kept.
    ``hits`` and ``misses`` count the lookups; ``bytes`` what is kept."""

    def __init__(self, max_bytes: int = DEFAULT_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes, self.bytes, self.hits, self.misses = max_bytes, 0, 0, 0
        self._kv: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()

    def with_head(self, model: ModelAdapter, inp: BlendInput, limit: int) -> BlendInput:
        """``inp`` with ``head_kv`` set to the K/V of its first ``limit`` rows, or of its rows before
        the first reused one if fewer; ``inp`` itself when the cache is off or nothing is reused."""
        if self.max_bytes == 0 or inp.cached is None or not bool(inp.reused.any()):
            return inp
        head = min(limit, int(inp.reused.to(torch.uint8).argmax()))  # argmax: the first reused row
        if head <= 0:
            return inp
        return replace(inp, head_kv=self.kv(model, inp.ids[:head]))

    def kv(self, model: ModelAdapter, ids: torch.Tensor) -> torch.Tensor:
        """[layers, 2, kv_heads, H, head_dim]: K (rotated, at positions 0..H-1) and V of ``ids`` [H],
        computed alone, in the compute dtype; from the cache when it holds them."""
        key = tuple(ids.tolist())
        with self._lock:
            kv = self._kv.get(key)
            if kv is not None:
                self._kv.move_to_end(key)
                self.hits += 1
                return kv
            self.misses += 1
        kv = _forward(model, ids)
        size = kv.numel() * kv.element_size()
        with self._lock:
            if size <= self.max_bytes and key not in self._kv:
                self._kv[key] = kv
                self.bytes += size
                while self.bytes > self.max_bytes:
                    _, old = self._kv.popitem(last=False)
                    self.bytes -= old.numel() * old.element_size()
        return kv

    def clear(self) -> None:
        with self._lock:
            self._kv.clear()
            self.bytes = 0


def _forward(model: ModelAdapter, ids: torch.Tensor) -> torch.Tensor:
    """The head's K/V from a full prefill of its ids alone, through the blend's own loop (the
    kernels that compute those rows in a full prefill of a whole prompt)."""
    alone = BlendInput(ids, torch.zeros_like(ids, dtype=torch.bool), None, torch.zeros_like(ids))
    out = blend_prefill(model, alone, NoneSelector(), {})
    return torch.stack([torch.stack([k[0], v[0]]) for k, v in out.kv])
