"""Warm-time encoding: the KV of chunks computed on their own, behind a fixed context.

This is the other half of the algorithm: ``blend.py`` reuses what this computes. Each chunk's K
(before RoPE) and V are computed once, behind the same context tokens (``BlendConfig.chunk_context``),
so a chunk's KV depends on its own tokens only and can be reused wherever it lands.

A warm can give way: inside ``between_layers(hook)`` every ``forward_chunks`` of this thread calls
``hook()`` before each layer, which may wait (the library's background warming waits while a
prefill or a decode runs) or raise to abandon the warm (the server's model thread does when a
request arrives). The hook is per thread (a context variable), so a prefill never sees it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from ..models.adapter import ModelAdapter
from .rope import RopeTables, apply_rope


_HOOK: ContextVar[Callable[[], None] | None] = ContextVar("cacheblend_between_layers", default=None)


@contextmanager
def between_layers(hook: Callable[[], None] | None) -> Iterator[None]:
    """Within the block, this thread's ``forward_chunks`` calls ``hook()`` before each layer."""
    token = _HOOK.set(hook)
    try:
        yield
    finally:
        _HOOK.reset(token)


def forward_grouped(model: ModelAdapter, context_ids: Sequence[int], chunks: Sequence[Sequence[int]]) -> torch.Tensor:
    """The KV of a batch of chunks (token ids), each behind ``context_ids``, right-padded.

    Returns [B, layers, 2, kv_heads, T, head_dim] with T the longest chunk; chunk b's rows are
    ``[..., :len(chunks[b]), :]`` (the padding rows after them are zero).

    Chunks are computed in sub-batches of equal length, so no sub-batch has padding: each takes
    the causal attention kernel instead of the explicit-mask path and spends nothing on padding
    rows. Not used by warming: under heavy CPU contention benchmarks/warm_rate.py measured it
    slower than one padded batch (37 vs 97 tokens/s), so warming keeps ``forward_padded`` until a
    quiet-machine measurement says otherwise.
    """
    by_length: dict[int, list[int]] = {}
    for b, tok in enumerate(chunks):
        by_length.setdefault(len(tok), []).append(b)
    out = None
    for length, rows in by_length.items():
        ids = torch.tensor([[*context_ids, *chunks[b]] for b in rows], device=model.device)  # [b, ctx + length]
        kv = forward_chunks(model, ids, torch.ones_like(ids, dtype=torch.bool), len(context_ids))  # [b, L, 2, Hkv, length, d]
        if out is None:
            out = kv.new_zeros((len(chunks), *kv.shape[1:4], max(map(len, chunks)), kv.shape[-1]))
        out[rows, ..., :length, :] = kv
    return out


def forward_padded(model: ModelAdapter, context_ids: Sequence[int], chunks: Sequence[Sequence[int]]) -> torch.Tensor:
    """The KV of a batch of chunks (token ids), each behind ``context_ids``, as one right-padded
    batch through the explicit-mask path. Returns [B, layers, 2, kv_heads, T, head_dim] with T the
    longest chunk; chunk b's rows are ``[..., :len(chunks[b]), :]`` (padding rows are garbage)."""
    width = len(context_ids) + max(map(len, chunks))
    dev = model.device
    ids = torch.zeros((len(chunks), width), dtype=torch.long, device=dev)  # [B, T]
    valid = torch.zeros((len(chunks), width), dtype=torch.bool, device=dev)  # [B, T]
    for b, tok in enumerate(chunks):
        row = [*context_ids, *tok]
        ids[b, : len(row)] = torch.tensor(row, device=dev)
        valid[b, : len(row)] = True
    return forward_chunks(model, ids, valid, len(context_ids))


@torch.inference_mode()
def forward_chunks(
    model: ModelAdapter, ids: torch.Tensor, valid: torch.Tensor, context: int
) -> torch.Tensor:
    """Computes the KV of a batch of chunks, each behind the same ``context`` tokens.

    ids: [B, T] (the context tokens, then the chunk, right-padded); valid: [B, T] bool (False on padding).
    Returns [B, layers, 2, kv_heads, T - context, head_dim]: K before RoPE, and V, of the chunk rows.
    """
    t = ids.shape[1]
    pos = torch.arange(t, device=ids.device)
    tables = RopeTables.at(model, pos)  # per rotary geometry: cos, sin [T, d]
    key_valid = None if bool(valid.all()) else valid
    hook = _HOOK.get()
    h = model.embed(ids)
    out = []
    for layer in range(model.num_layers):
        if hook is not None:
            hook()  # may wait, or raise to abandon this warm (``between_layers``)
        q, k, v = model.qkv(layer, h)
        out.append(torch.stack([k[:, :, context:], v[:, :, context:]], dim=1))  # [B, 2, Hkv, T-context, d]
        if layer + 1 < model.num_layers:  # the last layer's output is not needed
            cos, sin = tables.layer(layer)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            h = model.finish(layer, h, model.attend(layer, q, k, v, pos, key_valid))
    return torch.stack(out, dim=1)
