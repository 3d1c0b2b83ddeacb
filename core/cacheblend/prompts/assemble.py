"""Assembling a prompt's token ids and cached KV: one tokenization, chunk KV reused inside it.

The prompt's ids come from one tokenization of the whole text (``encode_prompt``). Each chunk span
is looked up by its own encoding (``encode_chunk``, the ids it was warmed with); a prompt token
reuses the cached row of the chunk token with the same character span (relative to the chunk) and
the same id. Everything else (template, separators, question, chunks that missed, and chunk-edge
tokens that merged with the text around them) is uncached and always recomputed.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..blending.blend import BlendInput
from ..result import BlendStats
from ..stores.record import ChunkRecord
from .finder import Span
from .request import PromptText
from .tokenize import Encoding


@dataclass
class Assembled:
    """The blend input plus what the lookup found: chunk hits/misses, tokens covered, load time, and
    ``places``: per chunk read, in prompt order, (its index among the chunks, its prompt rows, the
    chunk rows they read)."""

    input: BlendInput
    hits: int
    misses: int
    hit_tokens: int
    load_s: float
    places: list[tuple[int, list[int], list[int]]] = field(default_factory=list)

    def stats(self, recomputed: int, ratio: float) -> BlendStats:
        """The prefill's statistics once ``recomputed`` tokens went through the last layer."""
        n = self.input.ids.shape[0]
        return BlendStats(
            prompt_tokens=n,
            reused_tokens=n - recomputed,
            recomputed_tokens=recomputed,
            hit_tokens=self.hit_tokens,
            chunk_hits=self.hits,
            chunk_misses=self.misses,
            recompute_ratio=ratio,
            load_s=self.load_s,
        )


def aligned_rows(prompt: Encoding, span: Span, chunk: Encoding) -> tuple[list[int], list[int]]:
    """(prompt token indices, chunk token indices) of the tokens the two tokenizations share:
    same character span relative to the chunk, same id."""
    by_span = {offset: (j, tok) for j, (tok, offset) in enumerate(zip(chunk.ids, chunk.offsets))}
    starts = [a for a, _ in prompt.offsets]  # non-decreasing
    at = [], []
    for i in range(bisect.bisect_left(starts, span.start), len(prompt.ids)):
        a, b = prompt.offsets[i]
        if a >= span.end:
            break
        hit = by_span.get((a - span.start, b - span.start))
        if hit is not None and hit[1] == prompt.ids[i] and b > a:
            at[0].append(i)
            at[1].append(hit[0])
    return at


def chunk_encodings(prompt: PromptText, encode_chunk: Callable[[str], Encoding]) -> list[Encoding]:
    """Each chunk span's own encoding (the ids it was warmed with), in prompt order: what the
    caller looks the chunks' records up by."""
    return [encode_chunk(span.text) for span in prompt.chunks]


def assemble(
    prompt: PromptText,
    encoding: Encoding,
    chunks: list[Encoding],
    records: list[ChunkRecord | None],
    device: torch.device,
    first_alone: bool = False,
) -> Assembled:
    """The blend input of ``prompt`` (tokenized as ``encoding``) from data only: ``chunks`` the
    encodings of its chunk spans and ``records`` what the stores hold for each (None: a miss), in
    prompt order. Empty lists for a full prefill (nothing is read). The cached tensor holds zeros
    in uncached rows; ``load_s`` counts the gather here (the caller adds its lookup time).
    ``first_alone``: the first chunk's record, if it is read, was computed behind the chunk context
    alone; ``BlendInput.first_alone`` says so only when that chunk is read (some of its rows reused).
    """
    n = len(encoding.ids)
    if n == 0:
        raise ValueError("the prompt is empty")
    if len(chunks) != len(records) or (chunks and len(chunks) != len(prompt.chunks)):
        raise ValueError(f"{len(records)} records for {len(chunks)} chunk encodings of {len(prompt.chunks)} spans")
    spans = list(prompt.chunks) if chunks else []
    found: list[tuple[ChunkRecord, list[int], list[int]]] = []
    places = []
    hits = misses = 0
    first_read = False
    for i, (span, chunk, record) in enumerate(zip(spans, chunks, records)):
        hits, misses = hits + (record is not None), misses + (record is None)
        if record is not None:
            rows, chunk_rows = aligned_rows(encoding, span, chunk)
            if rows:
                found.append((record, rows, chunk_rows))
                places.append((i, rows, chunk_rows))
                first_read = first_read or i == 0
    t = time.perf_counter()
    reused = torch.zeros(n, dtype=torch.bool)
    offsets = torch.zeros(n, dtype=torch.long)
    cached = _gather(found, n, device) if found else None
    for _, rows, chunk_rows in found:
        reused[rows] = True
        offsets[rows] = torch.tensor(chunk_rows)
    load_s = time.perf_counter() - t
    blend_input = BlendInput(
        ids=torch.tensor(encoding.ids, dtype=torch.long, device=device),
        reused=reused.to(device),
        cached=cached,
        chunk_offsets=offsets.to(device),
        first_alone=first_alone and first_read,
    )
    return Assembled(blend_input, hits, misses, int(reused.sum()), load_s, places)


def _gather(found: list[tuple[ChunkRecord, list[int], list[int]]], n: int, device: torch.device) -> torch.Tensor:
    """[layers, 2, kv_heads, N, head_dim] in the records' dtype, zeros where nothing is cached.

    Built where the records live (the host); on CUDA in pinned memory, so that the blend's
    ``LayerFeed`` copies it to the device layer by layer, overlapped with the first layers."""
    layers, two, heads, _, dim = found[0][0].kv.shape
    home = found[0][0].kv.device
    pin = device.type == "cuda" and home.type == "cpu"
    cached = torch.empty((layers, two, heads, n, dim), dtype=found[0][0].kv.dtype, device=home, pin_memory=pin)
    uncovered = torch.ones(n, dtype=torch.bool)
    for _, rows, _ in found:
        uncovered[rows] = False
    cached.index_fill_(3, uncovered.nonzero()[:, 0].to(home), 0)  # only the uncached rows: a bool
    # index here masked-fills the whole ~70-80 MB tensor
    device = home
    for record, rows, chunk_rows in found:
        src = record.kv.to(device)  # [layers, 2, kv_heads, T, head_dim]
        if rows[-1] - rows[0] + 1 == len(rows) and chunk_rows[-1] - chunk_rows[0] + 1 == len(rows):
            cached[:, :, :, rows[0] : rows[-1] + 1] = src[:, :, :, chunk_rows[0] : chunk_rows[-1] + 1]
        else:  # a run with holes (tokens that tokenized differently inside the prompt)
            idx = torch.tensor(rows, device=device)
            cached.index_copy_(3, idx, src[:, :, :, torch.tensor(chunk_rows, device=device)])
    return cached
