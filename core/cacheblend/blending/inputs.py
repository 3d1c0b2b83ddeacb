"""What the blend takes: a prompt's ids, which rows reuse cached chunk KV, and its exact head."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Restart:
    """Reused rows that join the blend at ``layer`` from a residual stream kept at warm time, so
    they are recomputed from that layer on, not from layer 0 (research: benchmarks/restart_depth.py).

    positions: [r] sorted prompt positions of reused rows; hidden: [r, hidden] what entered
    ``layer`` for each of them when its chunk was warmed (what its record's K/V at ``layer`` were
    computed from). ``layer`` must come after the blend's first check layer."""

    layer: int
    positions: torch.Tensor
    hidden: torch.Tensor


@dataclass
class BlendInput:
    """A prompt ready to blend.

    ids: [N] token ids. reused: [N] bool, True where ``cached`` holds the token's KV.
    cached: [layers, 2, kv_heads, N, head_dim] K (before RoPE) and V, in the store's dtype (each
        layer is cast to the compute dtype when used); rows of uncached tokens are ignored. None
        when nothing is reused. It may live on the host: ``LayerFeed`` moves it layer by layer.
    chunk_offsets: [N] index of each token inside its chunk (0 for uncached tokens).
    first_alone: the first reused chunk is the prompt's first, its KV warmed behind the chunk context
        alone (a lead record, or chunks warmed alone): the lexical selector does not name it (``named_chunk``).
    head_kv: [layers, 2, kv_heads, H, head_dim] the K (rotated, at positions 0..H-1) and V of the
        prompt's first H rows in the compute dtype, exactly as a full prefill computes them (nothing
        precedes them: ``blending.head.HeadCache``). Those rows are uncached and not reused; the blend
        reads their K/V from here and never computes them past its first check layer. None: no head.
    restart: rows recomputed from a later layer on (``Restart``); None: every recomputed row starts at layer 0.
    gap: [N] fp32, each row's gap between its chunk's two records (``gap.record_gap``), for a selector
        that weighs by it (``draft+gap``); None otherwise.
    """

    ids: torch.Tensor
    reused: torch.Tensor
    cached: torch.Tensor | None
    chunk_offsets: torch.Tensor
    first_alone: bool = False
    head_kv: torch.Tensor | None = None
    restart: Restart | None = None
    gap: torch.Tensor | None = None

    @property
    def head(self) -> int:
        """The rows ``head_kv`` holds (0 without one)."""
        return 0 if self.head_kv is None else self.head_kv.shape[3]
