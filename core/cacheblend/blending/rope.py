"""Rotary position embedding math. Pure functions, no model state (``RopeTables`` only holds tensors).

cacheblend stores keys *before* RoPE. Realigning a cached chunk to new positions is then just
applying the model's own rotary embedding (its cos/sin tables, whatever the rope type: default,
``llama3``, ``yarn``, ``linear``...) at the final positions, so every rope type is exact by
construction. The alternative, storing rotated keys and rotating by a position delta, is only
exact for plain RoPE and breaks under scaled rope types (the attention factor of YaRN is applied
twice); the reference implementations refused those models for that reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotates half the last dimension: (x1, x2) -> (-x2, x1), the HF/Llama convention."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates ``x`` to the positions whose tables are ``cos``/``sin``.

    x: [..., T, head_dim]; cos, sin: [T, head_dim] (broadcast over the leading dims).
    The formula is the one transformers uses, ``x * cos + rotate_half(x) * sin``, so results match
    it bit for bit in every dtype; it is computed without building ``rotate_half(x)`` and the sum:
    ``x1 * cos - x2 * sin`` is what ``x1 * cos + (-x2) * sin`` rounds to, since negation is exact.
    """
    return _add_rotated(x * cos, *_rotated_products(x, sin))


def _rotated_products(x: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two halves of ``rotate_half(x) * sin`` up to the first half's sign: (x2 * sin1, x1 * sin2)."""
    half = x.shape[-1] // 2
    return x[..., half:] * sin[..., :half], x[..., :half] * sin[..., half:]


def _add_rotated(out: torch.Tensor, x2_sin: torch.Tensor, x1_sin: torch.Tensor) -> torch.Tensor:
    """``out + rotate_half(x) * sin`` in place, from ``_rotated_products(x, sin)``."""
    half = out.shape[-1] // 2
    out[..., :half].sub_(x2_sin)
    out[..., half:].add_(x1_sin)
    return out


def realign(cached: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype, room: int = 0) -> torch.Tensor:
    """Stored K/V to what attention and decoding use: a new [2, kv_heads, N, head_dim] in ``dtype``,
    keys rotated to the positions of ``cos``/``sin`` [N, head_dim], values cast. With ``room``, a
    new [2, kv_heads, N + room, head_dim] whose first N rows are those and the rest unset: rows
    after the prompt's (a draft's, ``blending/draft.py``) go there without copying the prompt's.

    cached: [2, kv_heads, N, head_dim] keys before RoPE and values, in the store's dtype. One
    contiguous cast first, then the keys rotate in place in ``dtype``: products that mix a 16-bit
    store with fp32 tables run several times slower on CPU than same-dtype ones, and the cast
    itself is a fast contiguous conversion. In fp32 the keys are bit-identical to
    ``apply_rope(cached[0].float(), cos, sin)``.
    """
    two, heads, n, d = cached.shape
    out = torch.empty((two, heads, n + room, d), dtype=dtype, device=cached.device)
    body = out[:, :, :n]  # [2, Hkv, N, d]
    body.copy_(cached)
    k = body[0]  # [Hkv, N, d]
    products = _rotated_products(k, sin)  # before k changes
    _add_rotated(k.mul_(cos), *products)
    return out


@dataclass(frozen=True)
class RopeTables:
    """The cos/sin tables [n, head_dim] of one set of positions, for every rotary geometry a model
    has, and which geometry each layer uses.

    Most families have one geometry for all layers; Gemma 3 has two (RoPE base 10k on its sliding
    layers, 1M on its full-attention layers), so a key stored before RoPE is rotated with its own
    layer's tables. Tables are computed once per geometry, not per layer.
    """

    cos: tuple[torch.Tensor, ...]  # per geometry: [n, d]
    sin: tuple[torch.Tensor, ...]
    kinds: tuple[int, ...]  # layer -> geometry

    @classmethod
    def at(cls, model: Any, positions: torch.Tensor) -> RopeTables:
        """The model's own tables at ``positions`` [n] (``model`` is a ``ModelAdapter``)."""
        tables = [model.rope(positions, kind) for kind in range(max(model.rope_kinds) + 1)]
        return cls(tuple(c for c, _ in tables), tuple(s for _, s in tables), tuple(model.rope_kinds))

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [n, d] of ``layer``."""
        kind = self.kinds[layer]
        return self.cos[kind], self.sin[kind]

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> RopeTables:
        """The same tables with ``fn`` applied to each (a row subset, a reshape)."""
        return RopeTables(tuple(map(fn, self.cos)), tuple(map(fn, self.sin)), self.kinds)

    def rows(self, index: torch.Tensor) -> RopeTables:
        """The tables of the rows ``index`` (indices or a bool mask into the n rows)."""
        return self.map(lambda t: t[index])
