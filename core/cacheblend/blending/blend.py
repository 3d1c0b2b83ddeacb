"""Blended prefill: the one place that knows the order of the algorithm.

For a prompt whose tokens are partly covered by cached chunk KV (keys stored before RoPE):

1. Layers before the first check layer run a full prefill over every token.
2. At each check layer, fresh K/V are computed for the tokens still active; the selector keeps
   the ``ratio`` share of reused tokens it scores highest (KV deviation, or the attention the
   question's rows pay them, computed here for the question rows only); every uncached token,
   and the last token (whose logits we need), stays active regardless.
3. From there on only active rows are computed. Their fresh K/V overwrite the cached rows, all
   other rows keep the cached K/V rotated to their final positions, and attention for the
   active rows runs over the merged K/V with an exact causal mask by position.

With ratio 1.0 every token stays active and the result is a full prefill; with ratio 0.0 only
uncached tokens are recomputed (full reuse).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.adapter import ModelAdapter
from .feed import LayerFeed
from .rope import apply_rope
from .selection import Candidates, Selector


@dataclass
class BlendInput:
    """A prompt ready to blend.

    ids: [N] token ids. reused: [N] bool, True where ``cached`` holds the token's KV.
    cached: [layers, 2, kv_heads, N, head_dim] K (before RoPE) and V, in the store's dtype (each
        layer is cast to the compute dtype when used); rows of uncached tokens are ignored. None
        when nothing is reused. It may live on the host: ``LayerFeed`` moves it layer by layer.
    chunk_offsets: [N] index of each token inside its chunk (0 for uncached tokens).
    """

    ids: torch.Tensor
    reused: torch.Tensor
    cached: torch.Tensor | None
    chunk_offsets: torch.Tensor


@dataclass
class BlendOutput:
    """kv: per layer (K after RoPE [1,Hkv,N,d], V [1,Hkv,N,d]); logits: [vocab] of the last token;
    recomputed: tokens computed through the last layer; active_per_layer: rows computed per layer."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    logits: torch.Tensor
    recomputed: int
    active_per_layer: list[int]


def budget_for(ratio: float, num_reused: int) -> int:
    """Reused tokens to keep recomputing at ``ratio``: round half up, never more than exist."""
    return min(num_reused, int(ratio * num_reused + 0.5))


@torch.inference_mode()
def blend_prefill(
    model: ModelAdapter,
    inp: BlendInput,
    selector: Selector,
    schedule: dict[int, float],
    fresh_check: bool = False,
) -> BlendOutput:
    """Runs the blended prefill. ``schedule`` maps check layer -> ratio of reused tokens kept.

    ``fresh_check``: at a check layer every row still active has fresh K/V already (they were
    computed to compare them with the cache), so keep them all for that layer's attention and
    cache instead of falling back to the cached K/V of the rows the selector drops.
    """
    n = inp.ids.shape[0]
    pos = torch.arange(n, device=inp.ids.device)  # [N]
    cos, sin = model.rope(pos)  # [N, d]
    active = pos  # [n] positions of the rows still computed, always sorted
    num_reused = int(inp.reused.sum())
    keep_always = ~inp.reused
    keep_always[-1] = True  # the last token's logits start decoding
    if inp.cached is None or num_reused == 0:
        schedule = {}
    first_check = min(schedule, default=model.num_layers)
    feed = LayerFeed(inp.cached, inp.ids.device, first_check) if schedule else None  # copies start now
    # The question: the uncached rows after the last reused token (at least the last row).
    last_reused = int(inp.reused.nonzero().max()) if num_reused else -1
    asking = pos > min(last_reused, n - 2)  # [N] bool

    h = model.embed(inp.ids[None])  # [1, n, hidden]
    kv: list[tuple[torch.Tensor, torch.Tensor]] = []
    active_per_layer = []
    for layer in range(model.num_layers):
        q, k, v = model.qkv(layer, h)  # q [1,H,n,d]; k, v [1,Hkv,n,d] before RoPE
        q_rot = apply_rope(q, cos[active], sin[active])
        k_rot = apply_rope(k, cos[active], sin[active])
        if layer < first_check:
            keys, values = k_rot, v  # full prefill: every row is fresh
        else:
            cached, owned = feed.layer(layer, k.dtype)  # [2,Hkv,N,d]
            keys = apply_rope(cached[0], cos, sin)[None]  # [1,Hkv,N,d] realigned to final positions
            # [1,Hkv,N,d], written below. A check layer must keep the cached V intact: the
            # selector compares it with the fresh V after the fresh rows are written here.
            values = cached[1][None] if owned and layer not in schedule else cached[1][None].clone()
            keys[:, :, active] = k_rot
            values[:, :, active] = v
        if layer in schedule:
            budget = budget_for(schedule[layer], num_reused)
            needs = bool(getattr(selector, "needs_query", False))
            attention = _query_attention(model, q_rot[0], keys[0], active, asking) if needs else None
            pick = _select(inp, cached, active, k[0], v[0], layer, selector, budget, keep_always, attention)
            if not fresh_check:
                _fall_back(keys, values, cached, active, pick, cos, sin)
            active, h, q_rot = active[pick], h[:, pick], q_rot[:, :, pick]
        attn = model.attend(layer, q_rot, keys, values, active, pos)  # [1, n, H*d]
        h = model.finish(layer, h, attn)
        kv.append((keys, values))
        active_per_layer.append(active.shape[0])
    logits = model.logits(h[0, -1])  # active[-1] == N-1, kept always
    return BlendOutput(kv=kv, logits=logits, recomputed=active.shape[0], active_per_layer=active_per_layer)


def _fall_back(keys, values, cached, active, pick, cos, sin) -> None:
    """The rows of ``active`` not in ``pick`` take their cached K/V (in place) from this layer on.

    keys, values: [1,Hkv,N,d]; cached: [2,Hkv,N,d] (keys before RoPE); pick: indices into active."""
    dropped = torch.ones_like(active, dtype=torch.bool)
    dropped[pick] = False
    gone = active[dropped]
    keys[:, :, gone] = apply_rope(cached[0][:, gone], cos[gone], sin[gone])[None]
    values[:, :, gone] = cached[1][None, :, gone]


def _query_attention(
    model: ModelAdapter, q: torch.Tensor, keys: torch.Tensor, active: torch.Tensor, asking: torch.Tensor
) -> torch.Tensor:
    """The attention the question's rows pay every prompt row at this layer: [H, m, N] fp32.

    q: [H, n, d] rotated queries of the active rows; keys: [Hkv, N, d] rotated keys (fresh where
    active, cached elsewhere). Only the m question rows are scored (m*N per head, no N*N).
    """
    mine = asking[active]  # [n] bool
    qa = q[:, mine].float()  # [H, m, d]
    k = keys.float().repeat_interleave(q.shape[0] // keys.shape[0], dim=0)  # [H, N, d]
    scores = qa @ k.transpose(1, 2) * model.scaling  # [H, m, N]
    causal = torch.arange(keys.shape[1], device=q.device)[None, :] <= active[mine][:, None]  # [m, N]
    return scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)


def _select(
    inp: BlendInput,
    cached: torch.Tensor,
    active: torch.Tensor,
    fresh_k: torch.Tensor,
    fresh_v: torch.Tensor,
    layer: int,
    selector: Selector,
    budget: int,
    keep_always: torch.Tensor,
    attention: torch.Tensor | None,
) -> torch.Tensor:
    """Indices into ``active`` to keep: every always-kept row plus the selector's pick (sorted)."""
    always = keep_always[active]  # [n] bool
    cand = (~always).nonzero().squeeze(1)  # indices into active of reusable candidates
    tokens = active[cand]
    chosen = selector(
        Candidates(
            layer=layer,
            fresh_k=fresh_k[:, cand],
            fresh_v=fresh_v[:, cand],
            cached_k=cached[0][:, tokens],
            cached_v=cached[1][:, tokens],
            positions=tokens,
            chunk_offsets=inp.chunk_offsets[tokens],
            query_attention=None if attention is None else attention[:, :, tokens],
        ),
        budget,
    )
    keep = always.clone()
    keep[cand[chosen]] = True
    return keep.nonzero().squeeze(1)
