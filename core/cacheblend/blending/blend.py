"""Blended prefill: the one place that knows the order of the algorithm.

For a prompt whose tokens are partly covered by cached chunk KV (keys stored before RoPE):

1. Layers before the first check layer run a full prefill over every token.
2. At each check layer, fresh K/V are computed for the tokens still active; the selector keeps
   the ``ratio`` share of reused tokens it scores highest (KV deviation, or the attention the
   question's rows pay them, computed here for the question rows only); every uncached token,
   and the last token (whose logits we need), stays active regardless.
3. From there on only active rows are computed. Each layer's cache starts as the cached K/V
   realigned to the final positions (keys rotated, in the compute dtype: what decoding needs),
   the active rows' fresh K/V written into it (at a check layer after the selection, which
   compares them with the stored K/V); the active rows attend over it, exact causal mask by position.

Ratio 1.0 is a full prefill, 0.0 full reuse (only uncached tokens are recomputed). An ``AutoRatio``
is resolved per request at its check layer, before the pick (``budget.py``).

A two-stage selector (``two_stage``: ``QuestionSelector``) changes the order. Stage 1 is the
full-reuse pass (ratio 0.0 from layer 0: no layer-0 prelude) that at each layer also scores the
attention the question's rows pay every prompt key; stage 2 runs step 3 from layer 0, over stage
1's caches, with the rows the selector picks by the fused score (the schedule's last ratio).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..models.adapter import ModelAdapter
from .budget import resolve
from .feed import LayerFeed
from .rope import RopeTables, apply_rope, realign
from .rows import RowPlan, attend_rows
from .question import QuestionScore
from .selection import Candidates, NoneSelector, Selector


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
    """

    ids: torch.Tensor
    reused: torch.Tensor
    cached: torch.Tensor | None
    chunk_offsets: torch.Tensor
    first_alone: bool = False


@dataclass
class BlendOutput:
    """kv: per layer (K after RoPE [1,Hkv,N,d], V [1,Hkv,N,d]); logits: [vocab] of the last token;
    recomputed: tokens computed through the last layer; active_rows: per layer, the positions [n]
    of the rows computed (at a check layer, those kept: ``tools/cost.py`` counts the work from them).
    A two-stage blend also reports its first stage (zeros and [] otherwise): first_stage_rows, the
    rows stage 1 computed through the last layer (the uncached rows and the last row);
    first_stage_active, its active_rows; question_rows, the rows whose attention over all N
    keys it scored at each of question_layers (the layers the selector fuses). With an auto budget
    (``AutoRatio`` in the schedule, ``budget.py``): ratio, the one it chose, and budget_signal, the
    signal it read (None otherwise)."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    logits: torch.Tensor
    recomputed: int
    active_rows: list[torch.Tensor]
    first_stage_rows: int = 0
    first_stage_active: list[torch.Tensor] = field(default_factory=list)
    question_rows: int = 0
    question_layers: list[int] = field(default_factory=list)
    ratio: float | None = None
    budget_signal: float | None = None

    @property
    def active_per_layer(self) -> list[int]:
        return [rows.shape[0] for rows in self.active_rows]


def budget_for(ratio: float, num_reused: int) -> int:
    """Reused tokens to keep recomputing at ``ratio``: round half up, never more than exist."""
    return min(num_reused, int(ratio * num_reused + 0.5))


@torch.inference_mode()
def blend_prefill(model: ModelAdapter, inp: BlendInput, selector: Selector, schedule: dict[int, float],
                  fresh_check: bool = False) -> BlendOutput:
    """Runs the blended prefill. ``schedule`` maps check layer -> ratio of reused tokens kept.

    ``fresh_check``: at a check layer every row still active has fresh K/V already (they were
    computed to compare them with the cache), so keep them all for that layer's attention and
    cache instead of falling back to the cached K/V of the rows the selector drops.

    A selector with ``two_stage`` set (``QuestionSelector``), or whose ``stage_one_for`` says so of
    this prompt (``LexicalQuestionSelector``), runs the two-stage blend (the module docstring,
    ``_two_stage``): ``schedule``'s last ratio is its recompute ratio, its check layers and
    ``fresh_check`` play no part (unless the selector sets ``at_check_layers``)."""
    staged = getattr(selector, "stage_one_for", None)
    if getattr(selector, "two_stage", False) or (staged and staged(
            inp.ids, inp.reused, inp.chunk_offsets, _Check.of(inp, selector).asking, inp.first_alone)):
        return _two_stage(model, inp, selector, schedule, fresh_check)
    return _blend(model, inp, selector, schedule, fresh_check)


def _blend(model: ModelAdapter, inp: BlendInput, selector: Selector, schedule: dict[int, float], fresh_check=False,
           observe: QuestionScore | None = None, base: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
           question_score: torch.Tensor | None = None) -> BlendOutput:
    """The one-pass blend, with what the two-stage blend adds: ``observe`` (layer, q [1,H,n,d]
    rotated, keys [1,Hkv,N,d], the n rows' positions) at every layer; ``base``, per layer the K and
    V [Hkv,N,d] of an earlier pass to start the cache from (written in place) instead of realigning
    the cached K/V; ``question_score`` [N], handed to the selector in ``Candidates``."""
    n = inp.ids.shape[0]
    pos = torch.arange(n, device=inp.ids.device)  # [N]
    tables = RopeTables.at(model, pos)  # per rotary geometry: cos, sin [N, d]
    check = _Check.of(inp, selector, question_score)
    if inp.cached is None or check.num_reused == 0:
        schedule = {}
    first_check = min(schedule, default=model.num_layers)
    feed = LayerFeed(inp.cached, inp.ids.device, first_check) if schedule and base is None else None  # copies start now
    rows = _Rows.at(pos, tables)
    h = model.embed(inp.ids[None])  # [1, n, hidden]
    kv: list[tuple[torch.Tensor, torch.Tensor]] = []
    active_rows, auto = [], {}  # auto: what an auto budget chose (budget.resolve)
    for layer in range(model.num_layers):
        cos, sin = tables.layer(layer)  # [N, d]: this layer's rotary geometry
        x = model.attn_input(layer, h)  # [1, n, hidden]
        k, v = model.kv(layer, x)  # [1,Hkv,n,d], k before RoPE
        if layer < first_check:
            keys, values = apply_rope(k, cos, sin), v  # [1,Hkv,N,d]: full prefill, every row fresh
        else:
            if base is None:
                cached = feed.layer(layer)  # [2,Hkv,N,d] store dtype, keys before RoPE; read-only
                layer_kv = realign(cached, cos, sin, k.dtype)  # [2,Hkv,N,d]: this layer's decode cache
            else:  # an earlier pass's cache: the cached K/V realigned, that pass's rows written
                layer_kv = base[layer]  # (K [Hkv,N,d], V [Hkv,N,d])
                cached = inp.cached[layer].to(inp.ids.device) if layer in schedule else None
            if layer in schedule:
                here = _CheckLayer(model, layer, x, k, v, cached, layer_kv)
                ratio, signal = resolve(schedule[layer], here, check, rows)  # an AutoRatio: per request
                auto = auto if signal is None else dict(ratio=ratio, budget_signal=signal)
                pick = check.pick(here, rows, budget_for(ratio, check.num_reused))  # into active
                if fresh_check:  # every active row has fresh K/V: all of them stay in the cache
                    _write(layer_kv, k, v, rows, layer)
                rows, x, h = rows.take(pick, tables), x[:, pick], h[:, pick]
                k, v = k[:, :, pick], v[:, :, pick]
            _write(layer_kv, k, v, rows, layer)
            keys, values = layer_kv[0][None], layer_kv[1][None]  # [1,Hkv,N,d]
        q = apply_rope(model.q(layer, x), *rows.rope.layer(layer))  # [1,H,n,d], only the rows kept
        if observe is not None:
            observe(layer, q, keys, rows.active)
        h = model.finish(layer, h, attend_rows(model, layer, q, keys, values, rows.plan))
        kv.append((keys, values))
        active_rows.append(rows.active)
    logits = model.logits(h[0, -1])  # active[-1] == N-1, kept always
    return BlendOutput(kv=kv, logits=logits, recomputed=active_rows[-1].shape[0], active_rows=active_rows, **auto)


def _two_stage(model: ModelAdapter, inp: BlendInput, selector: Selector, schedule: dict[int, float],
               fresh_check: bool) -> BlendOutput:
    """Stage 1: the full-reuse pass (the uncached rows and the last row, from layer 0, over the
    realigned cached K/V), scoring the question rows' attention at the selector's layers. Stage 2:
    from layer 0 again, over stage 1's caches, the uncached rows, the last row and the selector's
    ``budget_for(ratio, reused)`` reused tokens by the fused score, at every layer; or, with
    ``at_check_layers`` (``QuestionDeviationSelector``), the one-pass blend of ``schedule``. At a
    budget of 0 stage 1 is the whole blend (nothing is scored): exactly the ratio-0.0 blend."""
    num_reused = int(inp.reused.sum())
    if inp.cached is None or num_reused == 0 or not schedule:
        return _blend(model, inp, selector, {})  # nothing to reuse: a full prefill
    ratio = schedule[max(schedule)]  # the last check layer's: the recompute ratio
    if budget_for(getattr(ratio, "max_ratio", ratio), num_reused) == 0:  # an AutoRatio: its most
        return _blend(model, inp, NoneSelector(), {0: 0.0})  # full reuse
    asked = QuestionScore(model, _Check.of(inp, selector).asking, selector.fusion)
    first = _blend(model, inp, NoneSelector(), {0: 0.0}, observe=asked)
    score = asked.score(inp.reused, inp.chunk_offsets)  # [N]
    base = [(k[0], v[0]) for k, v in first.kv]  # [Hkv,N,d] views of stage 1's caches, written in place
    if getattr(selector, "at_check_layers", False):
        out = _blend(model, inp, selector, schedule, fresh_check, base=base, question_score=score)
    else:
        out = _blend(model, inp, selector, {0: ratio}, base=base, question_score=score)
    out.first_stage_rows, out.first_stage_active = first.recomputed, first.active_rows
    out.question_rows, out.question_layers = asked.rows, asked.layers
    return out


@dataclass
class _Rows:
    """The rows still computed: positions ``active`` [n] (sorted), their RoPE tables [n, d] per
    rotary geometry, and the attention plan every layer uses until the next check layer."""

    active: torch.Tensor
    rope: RopeTables
    plan: RowPlan

    @classmethod
    def at(cls, active: torch.Tensor, tables: RopeTables) -> _Rows:  # tables: the prompt's whole [N, d]
        return cls(active, tables.rows(active), RowPlan(active, tables.cos[0].shape[0]))

    def take(self, pick: torch.Tensor, tables: RopeTables) -> _Rows:  # pick: indices into active
        return _Rows.at(self.active[pick], tables)


def _write(layer_kv: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: _Rows, layer: int) -> None:
    """Fresh K (rotated here) and V [1,Hkv,n,d] of ``rows`` into ``layer``'s cache [2,Hkv,N,d]."""
    layer_kv[0].index_copy_(1, rows.active, apply_rope(k[0], *rows.rope.layer(layer)))
    layer_kv[1].index_copy_(1, rows.active, v[0])


def _indices(mask: torch.Tensor, count: int) -> torch.Tensor:
    """The indices of the ``count`` True entries of ``mask`` [n], in order: a stable sort puts them
    first, and unlike ``nonzero()`` the result's size is known without a device -> host sync."""
    return torch.sort((~mask).to(torch.uint8), stable=True).indices[:count]


@dataclass
class _CheckLayer:
    """A check layer's tensors. x: [1,n,hidden] the normed input of the active rows; k, v:
    [1,Hkv,n,d] their fresh K (before RoPE) and V; cached: [2,Hkv,N,d] the stored K (before RoPE)
    and V; layer_kv: [2,Hkv,N,d] the cached K/V realigned, no fresh row written yet."""

    model: ModelAdapter
    layer: int
    x: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cached: torch.Tensor
    layer_kv: torch.Tensor


@dataclass
class _Check:
    """What a check layer needs besides the layer's tensors. keep_always: [N] bool, the uncached
    rows and the last row (whose logits start decoding), all ``num_always`` of them always active;
    asking: [N] bool, the question (the uncached rows after the last reused token, or the last)."""

    inp: BlendInput
    selector: Selector
    num_reused: int
    keep_always: torch.Tensor
    num_always: int
    asking: torch.Tensor
    question_score: torch.Tensor | None = None  # [N]: a two-stage blend's fused stage-1 score

    @classmethod
    def of(cls, inp: BlendInput, selector: Selector, question_score: torch.Tensor | None = None) -> _Check:
        n = inp.ids.shape[0]
        keep_always = ~inp.reused  # [N]
        keep_always[-1] = True
        num_reused = int(inp.reused.sum())
        last_reused = int(inp.reused.nonzero().max()) if num_reused else -1
        asking = torch.arange(n, device=inp.ids.device) > min(last_reused, n - 2)  # [N]
        return cls(inp, selector, num_reused, keep_always, int(keep_always.sum()), asking, question_score)

    def pick(self, at: _CheckLayer, rows: _Rows, budget: int) -> torch.Tensor:
        """Indices into ``rows.active`` to keep: every always-kept row plus the selector's pick
        of ``budget`` candidates (sorted)."""
        always = self.keep_always[rows.active]  # [n] bool
        cand = _indices(~always, rows.active.shape[0] - self.num_always)  # into active: reusable rows
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
        return _indices(keep, self.num_always + chosen.shape[0])

    def _query_attention(self, at: _CheckLayer, rows: _Rows) -> torch.Tensor:
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
