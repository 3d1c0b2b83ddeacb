"""A check layer's pick: which rows stay computed (every uncached row, the last row, and the
selector's choice among the reused ones), and the question's attention some selectors read there.
``blend.py`` calls it at each check layer; ``budget.py`` reads the same objects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..models.adapter import ModelAdapter
from .rope import apply_rope
from .selection import Candidates, Selector

if TYPE_CHECKING:
    from .inputs import BlendInput
    from .rows import Rows


def true_indices(mask: torch.Tensor, count: int) -> torch.Tensor:
    """The indices of the ``count`` True entries of ``mask`` [n], in order: a stable sort puts them
    first, and unlike ``nonzero()`` the result's size is known without a device -> host sync."""
    return torch.sort((~mask).to(torch.uint8), stable=True).indices[:count]


@dataclass
class CheckLayer:
    """A check layer's tensors. x: [1,n,hidden] the normed input of the active rows; k, v:
    [1,Hkv,n,d] their fresh K (before RoPE) and V; cached: [2,Hkv,N,d] the stored K (before RoPE)
    and V (None when nothing is reused, only a head); layer_kv: [2,Hkv,N,d] the cached K/V
    realigned, no fresh row written yet."""

    model: ModelAdapter
    layer: int
    x: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cached: torch.Tensor | None
    layer_kv: torch.Tensor


@dataclass
class Check:
    """What a check layer needs besides the layer's tensors. keep_always: [N] bool, the uncached
    rows but the head's (``BlendInput.head_kv``: read, never kept) and the last row (whose logits
    start decoding), all ``num_always`` of them always active; asking: [N] bool, the question
    (the uncached rows after the last reused token, or the last)."""

    inp: BlendInput
    selector: Selector
    num_reused: int
    keep_always: torch.Tensor
    num_always: int
    asking: torch.Tensor
    question_score: torch.Tensor | None = None  # [N]: a two-stage blend's fused stage-1 score

    @classmethod
    def of(cls, inp: BlendInput, selector: Selector, question_score: torch.Tensor | None = None) -> Check:
        n = inp.ids.shape[0]
        keep_always = ~inp.reused  # [N]
        keep_always[: inp.head] = False
        keep_always[-1] = True
        num_reused = int(inp.reused.sum())
        last_reused = int(inp.reused.nonzero().max()) if num_reused else -1
        asking = torch.arange(n, device=inp.ids.device) > min(last_reused, n - 2)  # [N]
        return cls(inp, selector, num_reused, keep_always, int(keep_always.sum()), asking, question_score)

    def pick(self, at: CheckLayer, rows: Rows, budget: int) -> torch.Tensor:
        """Indices into ``rows.active`` to keep: every always-kept row plus the selector's pick
        of ``budget`` candidates (sorted)."""
        n = rows.active.shape[0]
        always = self.keep_always[rows.active]  # [n] bool
        head = self.inp.head if n == self.keep_always.shape[0] else 0  # the head's rows: active until the first pick
        if n - self.num_always - head == 0:  # no candidate (only a head was read)
            return true_indices(always, self.num_always)
        cand = true_indices(~always & (rows.active >= head), n - self.num_always - head)  # into active: reusable rows
        tokens = rows.active[cand]
        needs = bool(getattr(self.selector, "needs_query", False))
        chosen = self.selector(
            Candidates(
                layer=at.layer,
                fresh_k=at.k[0][:, cand],
                fresh_v=at.v[0][:, cand],
                cached_k=at.cached[0][:, tokens].to(at.k.dtype),
                cached_v=at.cached[1][:, tokens].to(at.v.dtype),
                positions=tokens,
                chunk_offsets=self.inp.chunk_offsets[tokens],
                query_attention=self._query_attention(at, rows)[:, :, tokens] if needs else None,
                question_score=None if self.question_score is None else self.question_score[tokens],
                ids=self.inp.ids[tokens], question_ids=self.inp.ids[self.asking],
                first_alone=self.inp.first_alone,
            ),
            budget,
        )
        keep = always.clone()
        keep[cand[chosen]] = True
        return true_indices(keep, self.num_always + chosen.shape[0])

    def _query_attention(self, at: CheckLayer, rows: Rows) -> torch.Tensor:
        """The attention the question's rows pay every prompt row at this layer: [H, m, N] fp32,
        over the keys as they are before the selection (fresh where active, cached elsewhere).
        Only the m question rows are scored (m*N per head, no N*N)."""
        mine = self.asking[rows.active]  # [n] bool
        q = at.model.q(at.layer, at.x[:, mine])  # [1, H, m, d] before RoPE
        cos, sin = rows.rope.layer(at.layer)  # [n, d]
        q = apply_rope(q, cos[mine], sin[mine])[0].float()  # [H, m, d]
        keys = at.layer_kv[0].clone()  # [Hkv, N, d]
        keys.index_copy_(1, rows.active, apply_rope(at.k[0], cos, sin))
        keys = keys.float().repeat_interleave(q.shape[0] // keys.shape[0], dim=0)  # [H, N, d]
        scores = q @ keys.transpose(1, 2) * at.model.scaling  # [H, m, N]
        causal = torch.arange(keys.shape[1], device=q.device)[None, :] <= rows.active[mine][:, None]  # [m, N]
        return scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
