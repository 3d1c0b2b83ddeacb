"""Assembling a prompt's token ids and cached KV from its segments and the stores."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..blending.blend import BlendInput
from ..result import BlendStats
from .tokenize import Segment
from ..stores.record import ChunkRecord


@dataclass
class Assembled:
    """The blend input plus what the lookup found: chunk hits/misses, tokens covered, load time."""

    input: BlendInput
    hits: int
    misses: int
    cached_tokens: int
    load_s: float

    def stats(self, recomputed: int, ratio: float) -> BlendStats:
        """The prefill's statistics once ``recomputed`` tokens went through the last layer."""
        n = self.input.ids.shape[0]
        return BlendStats(
            prompt_tokens=n,
            reused_tokens=n - recomputed,
            recomputed_tokens=recomputed,
            cached_tokens=self.cached_tokens,
            chunk_hits=self.hits,
            chunk_misses=self.misses,
            recompute_ratio=ratio,
            load_s=self.load_s,
        )


def assemble(
    segments: Sequence[Segment],
    tokenize: Callable[[str], list[int]],
    lookup: Callable[[list[int]], ChunkRecord | None] | None,
    bos_ids: Sequence[int],
    device: torch.device,
) -> Assembled:
    """Tokenizes each segment on its own and fetches the KV of chunk segments via ``lookup``.

    ``lookup`` is None for a full prefill (nothing is read). ``bos_ids`` (the BOS the tokenizer
    adds to every encoding, or nothing) go first. The cached tensor holds zeros in uncached rows.
    """
    ids: list[int] = list(bos_ids)
    parts: list[tuple[int, ChunkRecord | None]] = [(len(ids), None)]
    offsets: list[torch.Tensor] = [torch.zeros(len(ids), dtype=torch.long)]
    hits = misses = cached_tokens = 0
    load_s = 0.0
    for seg in segments:
        seg_ids = tokenize(seg.text)
        if not seg_ids:
            continue
        record = None
        if seg.chunk and lookup is not None:
            t = time.perf_counter()
            record = lookup(seg_ids)
            load_s += time.perf_counter() - t
            hits, misses = hits + (record is not None), misses + (record is None)
        cached_tokens += len(seg_ids) if record is not None else 0
        ids.extend(seg_ids)
        parts.append((len(seg_ids), record))
        offsets.append(torch.arange(len(seg_ids)) if seg.chunk else torch.zeros(len(seg_ids), dtype=torch.long))
    if not ids:
        raise ValueError("the prompt is empty")
    t = time.perf_counter()
    cached = _stack(parts, device) if cached_tokens else None
    load_s += time.perf_counter() - t
    reused = torch.cat([torch.full((n,), rec is not None) for n, rec in parts])
    blend_input = BlendInput(
        ids=torch.tensor(ids, dtype=torch.long, device=device),
        reused=reused.to(device),
        cached=cached,
        chunk_offsets=torch.cat(offsets).to(device),
    )
    return Assembled(blend_input, hits, misses, cached_tokens, load_s)


def _stack(parts: list[tuple[int, ChunkRecord | None]], device: torch.device) -> torch.Tensor:
    """[layers, 2, kv_heads, N, head_dim] in the records' dtype, zeros where nothing is cached."""
    template = next(rec.kv for _, rec in parts if rec is not None)
    layers, two, heads, _, dim = template.shape
    blocks = [
        rec.kv.to(device) if rec is not None else template.new_zeros((layers, two, heads, n, dim), device=device)
        for n, rec in parts
        if n
    ]
    return torch.cat(blocks, dim=3)
