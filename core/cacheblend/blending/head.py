"""The prompt's head, computed once: the exact K/V of the tokens before its first chunk.

The requests of one application start alike: the chat template's header, a system prompt, the
instructions before the retrieved passages. Nothing precedes those tokens, so their K/V depend on
their ids alone and a full prefill computes the same values on every request (prefix caching's
premise). ``HeadCache`` keeps them per head (keyed by its ids), computed the first time a head is
seen (a forward of those ids alone, in the compute dtype) and kept by recency within a byte budget;
``with_head`` gives a ``BlendInput`` its head, which the blend reads and never computes past its
first check layer (``blend.py``). A prompt whose chunks all missed reads its head and computes
the rest (prefix caching); a prompt without chunks, or a full prefill, has none. Its head is its
tokens before its first chunk (``Request.head_tokens``), never past the first reused row (a first
chunk that missed is not part of the head's key) nor the last row. A head computed for a request
(a miss) counts as computed in its statistics; only one read from the cache counts as reused.
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

    def with_head(self, model: ModelAdapter, inp: BlendInput, limit: int) -> tuple[BlendInput, bool]:
        """``inp`` with ``head_kv`` set to the K/V of its first ``limit`` rows (fewer if a reused row
        or the last row comes first), and whether they came from the cache (False: computed now,
        or no head: ``inp`` itself when the cache is off or ``limit`` is 0)."""
        if self.max_bytes == 0 or limit <= 0:
            return inp, False
        first_reused = int(inp.reused.to(torch.uint8).argmax()) if bool(inp.reused.any()) else limit
        head = min(limit, first_reused, inp.ids.shape[0] - 1)  # the last row is computed: its logits
        if head <= 0:
            return inp, False
        kv, hit = self.kv(model, inp.ids[:head])
        return replace(inp, head_kv=kv), hit

    def kv(self, model: ModelAdapter, ids: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """[layers, 2, kv_heads, H, head_dim]: K (rotated, at positions 0..H-1) and V of ``ids`` [H],
        computed alone, in the compute dtype; and whether the cache held them."""
        key = tuple(ids.tolist())
        with self._lock:
            kv = self._kv.get(key)
            if kv is not None:
                self._kv.move_to_end(key)
                self.hits += 1
                return kv, True
            self.misses += 1
        kv = head_forward(model, ids)
        size = kv.numel() * kv.element_size()
        with self._lock:
            if size <= self.max_bytes and key not in self._kv:
                self._kv[key] = kv
                self.bytes += size
                while self.bytes > self.max_bytes:
                    _, old = self._kv.popitem(last=False)
                    self.bytes -= old.numel() * old.element_size()
        return kv, False

def head_forward(model: ModelAdapter, ids: torch.Tensor) -> torch.Tensor:
    """The head's K/V [layers, 2, kv_heads, H, head_dim] (K rotated) from a full prefill of its ids
    [H] alone, through the blend's own loop (the kernels that compute those rows in a full prefill
    of a whole prompt)."""
    alone = BlendInput(ids, torch.zeros_like(ids, dtype=torch.bool), None, torch.zeros_like(ids))
    out = blend_prefill(model, alone, NoneSelector(), {})
    return torch.stack([torch.stack([k[0], v[0]]) for k, v in out.kv])
