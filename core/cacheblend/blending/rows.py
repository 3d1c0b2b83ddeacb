"""How a subset of a prompt's rows attends over the whole prompt's keys: the blend's row strategy.

After a check layer only the selected rows (and every uncached one) are computed. Attending them
with one [n, N] mask would spend most of the work on masked-out keys (a row early in the prompt sees
few keys), so the rows are split into contiguous groups that each attend only to the keys up to
their last row (and no further back than the layer's sliding window). The adapter runs each block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.adapter import ModelAdapter
from ..models.kernels import prefix_split, stack_heads
from .rope import RopeTables

_GROUPS = 8  # query groups for partial-row attention (measured: 8 is fastest at 3k tokens, 15%)
_GROUP_MIN_ROWS = 64


class RowPlan:
    """How a sorted subset of a prompt's rows attends, built once per check layer of a blend and
    used by every layer until the next one.

    The rows are split into ``_GROUPS`` contiguous groups (one below ``_GROUP_MIN_ROWS`` rows); a
    group attends only to the keys up to its last row. Building the plan reads the groups' first
    and last positions to the host, the one host sync of a check layer; each group's additive
    mask is built on first use per (sliding window, dtype) and reused by the later layers.
    """

    def __init__(self, q_pos: torch.Tensor, num_keys: int) -> None:
        self.q_pos = q_pos  # [n] sorted positions
        n = q_pos.shape[0]
        self.causal = n == num_keys  # every row: the causal kernel applies
        splits = torch.tensor_split(torch.arange(n), _GROUPS if n >= _GROUP_MIN_ROWS else 1)  # host-side
        bounds = [(int(c[0]), int(c[-1])) for c in splits if len(c)]  # first and last row of each group
        first, last = q_pos[torch.tensor(bounds, device=q_pos.device).T].tolist()  # the one host read
        self._rows = [(a, z + 1, p0, p1) for (a, z), p0, p1 in zip(bounds, first, last)]  # (a, b, pos of a, of b-1)
        self._masks: dict[tuple[int | None, torch.dtype, bool, int], list[torch.Tensor]] = {}  # masks()'s args

    def groups(self, window: int | None, split: bool = False) -> list[tuple[int, int, int, int, int]]:
        """(a, b, lo, mid, hi): rows [a, b) see every key in [lo, mid) and, by the mask, some of
        [mid, hi) (key index == position). ``split`` (full attention only): mid is the group's first
        position, the keys before it seen by every row of the group; otherwise mid == lo."""
        out = []
        for a, b, p0, p1 in self._rows:
            lo = 0 if window is None else max(0, p0 - window + 1)
            out.append((a, b, lo, p0 if split and window is None else lo, p1 + 1))
        return out

    def masks(self, window: int | None, dtype: torch.dtype, split: bool = False, stack: int = 1) -> list[torch.Tensor]:
        """Per group, the additive mask [1, 1, stack*(b-a), hi-mid] of ``groups(window, split)``: 0
        where a row sees a key, -inf elsewhere (what SDPA makes of a boolean mask, made once),
        repeated ``stack`` times along the rows (``kernels.stack_heads``)."""
        key = (window, dtype, split, stack)
        if key not in self._masks:
            masks = []
            for a, b, lo, mid, hi in self.groups(window, split):
                q_pos, k_pos = self.q_pos[a:b, None], torch.arange(mid, hi, device=self.q_pos.device)[None]
                seen = k_pos <= q_pos  # [b-a, hi-mid]
                if window is not None:
                    seen &= k_pos > q_pos - window
                mask = torch.zeros(seen.shape, dtype=dtype, device=seen.device).masked_fill_(~seen, float("-inf"))
                masks.append(stack_heads(mask[None, None], stack))
            self._masks[key] = masks
        return self._masks[key]


def attend_rows(model: ModelAdapter, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: RowPlan) -> torch.Tensor:
    """Attention of the rows of ``plan`` (sorted positions) over a whole prompt's keys.

    q [1,H,n,d] (rotated) at plan.q_pos; k, v [1,Hkv,N,d] at positions 0..N-1. Each group of
    rows attends only to the keys up to its last row (most masked-out work skipped), with the
    masks the plan built once; on CPU a group of a full-attention layer runs as its visible prefix
    and the rest, merged (``models/kernels.py``). With every row active this is one kernel call,
    as a full prefill runs it. Returns [1, n, H*d]."""
    if plan.causal:
        return model.attend(layer, q, k, v, plan.q_pos)
    window = model.window(layer)
    split = window is None and prefix_split(q.device)
    stack = model.num_heads // model.num_kv_heads if split else 1
    parts = [
        model.attend_block(q[:, :, a:b], k[:, :, lo:hi], v[:, :, lo:hi], mask, mid - lo if split else None)  # [1,b-a,H,d]
        for (a, b, lo, mid, hi), mask in zip(plan.groups(window, split), plan.masks(window, q.dtype, split, stack))
    ]
    return torch.cat(parts, dim=1).reshape(q.shape[0], q.shape[2], -1)


@dataclass
class Rows:
    """The rows still computed: positions ``active`` [n] (sorted), their RoPE tables [n, d] per
    rotary geometry, and the attention plan every layer uses until the next check layer."""

    active: torch.Tensor
    rope: RopeTables
    plan: RowPlan

    @classmethod
    def at(cls, active: torch.Tensor, tables: RopeTables) -> Rows:  # tables: the prompt's whole [N, d]
        return cls(active, tables.rows(active), RowPlan(active, tables.cos[0].shape[0]))

    def take(self, pick: torch.Tensor, tables: RopeTables) -> Rows:  # pick: indices into active
        return Rows.at(self.active[pick], tables)
