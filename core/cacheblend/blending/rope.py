"""Rotary position embedding math. Pure functions, no model state.

cacheblend stores keys *before* RoPE. Realigning a cached chunk to new positions is then just
applying the model's own rotary embedding (its cos/sin tables, whatever the rope type: default,
``llama3``, ``yarn``, ``linear``...) at the final positions, so every rope type is exact by
construction. The alternative, storing rotated keys and rotating by a position delta, is only
exact for plain RoPE and breaks under scaled rope types (the attention factor of YaRN is applied
twice); the reference implementations refused those models for that reason.
"""

from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotates half the last dimension: (x1, x2) -> (-x2, x1), the HF/Llama convention."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates ``x`` to the positions whose tables are ``cos``/``sin``.

    x: [..., T, head_dim]; cos, sin: [T, head_dim] (broadcast over the leading dims).
    The formula is the one transformers uses, so fp32 results match it bit for bit.
    """
    return (x * cos) + (rotate_half(x) * sin)


def realign(cached: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Stored K/V to what attention and decoding use: a new [2, kv_heads, N, head_dim] in ``dtype``,
    keys rotated to the positions of ``cos``/``sin`` [N, head_dim], values cast.

    cached: [2, kv_heads, N, head_dim] keys before RoPE and values, in the store's dtype. The cast
    happens inside the rotation (one pass per op, no full-size temporaries); in fp32 the keys are
    bit-identical to ``apply_rope(cached[0].float(), cos, sin)``.
    """
    out = torch.empty(cached.shape, dtype=dtype, device=cached.device)  # [2, Hkv, N, d]
    out[1].copy_(cached[1])
    x, k = cached[0], out[0]  # [Hkv, N, d]
    half = x.shape[-1] // 2
    x1, x2, k1, k2 = x[..., :half], x[..., half:], k[..., :half], k[..., half:]
    torch.mul(x1, cos[:, :half], out=k1)  # rotate_half(x) is (-x2, x1): the same products, exactly
    torch.mul(x2, cos[:, half:], out=k2)
    k1.sub_(x2 * sin[:, :half])
    k2.add_(x1 * sin[:, half:])
    return out
