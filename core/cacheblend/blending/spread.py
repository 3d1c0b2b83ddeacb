"""Deviation spread: a chunk's stale rows moved by the deviation its recomputed rows showed.

From the first check layer on, the blend knows, for the reused rows it recomputes, how far their
fresh K/V are from their record's (fresh - cached, keys before RoPE). The rows it does not
recompute keep their record's K/V, though their chunk now follows other passages. Part of what the
new context changes is shared by a chunk's rows (what precedes the chunk, written into every row's
residual stream), so each stale reused row gets ``alpha`` times the mean deviation of the
recomputed rows of its chunk, the key part rotated to the row's position (RoPE is linear). The
recomputed rows are the most deviating ones (the selector picks them), so their mean overstates the
others': ``alpha`` < 1 (``BlendConfig.spread``; chosen on development data, docs/DEVIATION-SPREAD.md).
A chunk with no recomputed row (none picked in it) keeps its record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .rope import apply_rope


def chunk_numbers(reused: torch.Tensor, chunk_offsets: torch.Tensor) -> torch.Tensor:
    """[N] the chunk each reused row belongs to (0, 1, ... in prompt order), -1 for other rows."""
    starts = reused & (chunk_offsets == 0)
    return torch.where(reused, torch.cumsum(starts.long(), 0) - 1, -1)


@dataclass
class DeviationSpread:
    """One prompt's spread: ``chunks`` (``chunk_numbers``) and the share ``alpha``. Which rows give
    and take a deviation changes only where the active rows do (at a check layer): ``_plan`` keeps
    it for the last active set seen."""

    chunks: torch.Tensor  # [N]
    alpha: float
    _plan: tuple = field(default=(None, None), repr=False)  # (active rows, their plan)

    @classmethod
    def of(cls, reused: torch.Tensor, chunk_offsets: torch.Tensor, alpha: float) -> DeviationSpread | None:
        """The spread of a prompt (``BlendInput.reused``, ``chunk_offsets``); None at ``alpha`` 0."""
        return cls(chunk_numbers(reused, chunk_offsets), float(alpha)) if alpha else None

    def apply(self, layer_kv: torch.Tensor, fresh: tuple[torch.Tensor, torch.Tensor], active: torch.Tensor,
              cached: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Adds to ``layer_kv`` [2,Hkv,N,d] (keys rotated, values), at every reused row not in
        ``active`` [n], ``alpha`` times its chunk's mean deviation. fresh: K (before RoPE) and V
        [1,Hkv,n,d] of the ``active`` rows; cached: [2,Hkv,N,d] the records (keys before RoPE, any
        dtype); rope: (cos, sin) [N,d] of this layer at the prompt's positions."""
        plan = self._plan[1] if self._plan[0] is active else self._planned(active)
        if plan is None:
            return
        has_record, src, at, count, dst = plan
        heads, _, dim = layer_kv.shape[1:]
        dtype = layer_kv.dtype
        scale = (self.alpha / count.clamp(min=1).to(dtype))[None, :, None]  # [1, C, 1]
        for part in (0, 1):
            deviation = fresh[part][0][:, has_record].to(dtype) - cached[part][:, src].to(dtype)  # [Hkv, s, d]
            mean = deviation.new_zeros((heads, count.shape[0], dim)).index_add_(1, at, deviation) * scale  # [Hkv,C,d]
            shift = mean[:, self.chunks[dst]]  # [Hkv, t, d]
            if part == 0:
                shift = apply_rope(shift, rope[0][dst], rope[1][dst])
            layer_kv[part].index_add_(1, dst, shift)

    def _planned(self, active: torch.Tensor) -> tuple | None:
        """For ``active`` [n]: (its rows that have a record [n] bool, those rows [s], their chunks
        [s], recomputed rows per chunk [C], the stale rows of chunks that have some [t]); None when
        no row moves."""
        chunks = self.chunks
        has_record = chunks[active] >= 0  # [n]: active rows that have a record
        plan = None
        if bool(has_record.any()):
            src = active[has_record]  # [s]
            at = chunks[src]  # [s]
            count = torch.bincount(at, minlength=int(chunks.max()) + 1)  # [C]
            stale = chunks >= 0
            stale[active] = False
            dst = stale.nonzero()[:, 0]  # [t]
            dst = dst[count[chunks[dst]] > 0]  # rows of chunks that have recomputed rows
            plan = (has_record, src, at, count, dst) if dst.numel() else None
        self._plan = (active, plan)
        return plan
