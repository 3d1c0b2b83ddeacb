"""Blended prefill: the one place that knows the order of the algorithm.

For a prompt whose tokens are partly covered by cached chunk KV (keys stored before RoPE):

1. Layers before the first check layer run a full prefill over every token.
2. At each check layer, fresh K/V are computed for the tokens still active; the selector keeps
   the ``ratio`` share of reused tokens it scores highest (KV deviation, or the attention the
   question's rows pay them, computed here for the question rows only: ``check.py``); every
   uncached token but the prompt's head, and the last token (whose logits we need), stays active.
3. From there on only active rows are computed. Each layer's cache starts as the cached K/V
   realigned to the final positions (keys rotated, in the compute dtype: what decoding needs),
   with the head's exact K/V (``BlendInput.head_kv``, what a full prefill computes for the rows
   before the first chunk: ``head.py``) and the active rows' fresh K/V written into it (at a check
   layer after the selection, which compares them with the stored K/V); the active rows attend
   over it, exact causal mask by position. With a ``spread``, the reused rows not recomputed then
   move by a share of the deviation their chunk's recomputed rows showed (``spread.py``).

Ratio 1.0 is a full prefill, 0.0 full reuse (only uncached tokens are recomputed). An ``AutoRatio``
is resolved per request at its check layer, before the pick (``budget.py``).

A two-stage selector (``two_stage``: ``QuestionSelector``) changes the order. Stage 1 is the
full-reuse pass (ratio 0.0 from layer 0: no layer-0 prelude) that at each layer also scores the
attention the question's rows pay every prompt key; stage 2 runs step 3 from layer 0, over stage
1's caches, with the rows the selector picks by the fused score (the schedule's last ratio).

A ``BlendInput.restart`` (research, docs/RESTART-DEPTH.md) adds reused rows to the active ones at a
layer after the check, from the residual stream their record was computed from.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..models.adapter import ModelAdapter
from .budget import after_stage_one, resolve
from .feed import LayerFeed
from .rope import RopeTables, apply_rope, realign
from .check import Check, CheckLayer
from .inputs import BlendInput, Restart
from .question import QuestionScore
from .rows import Rows, attend_rows
from .selection import NoneSelector, Selector
from .spread import DeviationSpread

__all__ = ["BlendInput", "BlendOutput", "blend_prefill", "budget_for", "reuse_pass"]


@dataclass
class BlendOutput:
    """kv: per layer (K after RoPE [1,Hkv,N,d], V [1,Hkv,N,d]); logits: [vocab] of the last token;
    recomputed: tokens computed through the last layer; active_rows: per layer, the positions [n]
    of the rows computed (at a check layer, those kept: ``tools/cost.py`` counts the work from them).
    A two-stage blend also reports its first stage (zeros and [] otherwise): first_stage_rows, the
    rows stage 1 computed through the last layer (the uncached rows but the head's, and the last row);
    first_stage_active, its active_rows; question_rows, the rows whose attention over all N
    keys it scored at each of question_layers (the layers the selector fuses), drafted of them a
    drafted answer's, each also its own LM head (``draft.py``). With an auto budget
    (``AutoRatio`` in the schedule, ``budget.py``): ratio, the one it chose, and budget_signal, the
    signal it read (None otherwise). A pass with ``room`` (``reuse_pass``): grown, per layer the
    cache [2,Hkv,N+room,d] whose first N rows kv's K and V view ([] otherwise). first_stage_s: the
    seconds stage 1 took, its score included (on CUDA the device is synchronised to time it);
    draft_margin: with a drafted answer, how sure full reuse was of its least sure token (None otherwise);
    draft: its tokens ([] otherwise), which decoding verifies in one pass (``generation/lockstep.py``)."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    logits: torch.Tensor
    recomputed: int
    active_rows: list[torch.Tensor]
    first_stage_rows: int = 0
    first_stage_active: list[torch.Tensor] = field(default_factory=list)
    question_rows: int = 0
    question_layers: list[int] = field(default_factory=list)
    drafted: int = 0
    first_stage_s: float = 0.0
    ratio: float | None = None
    budget_signal: float | None = None
    grown: list[torch.Tensor] = field(default_factory=list)
    draft_margin: float | None = None
    draft: list[int] = field(default_factory=list)

    @property
    def active_per_layer(self) -> list[int]:
        return [rows.shape[0] for rows in self.active_rows]


def budget_for(ratio: float, num_reused: int) -> int:
    """Reused tokens to keep recomputing at ``ratio``: round half up, never more than exist."""
    return min(num_reused, int(ratio * num_reused + 0.5))


@torch.inference_mode()
def blend_prefill(model: ModelAdapter, inp: BlendInput, selector: Selector, schedule: dict[int, float],
                  fresh_check: bool = False, spread: float = 0.0) -> BlendOutput:
    """Runs the blended prefill. ``schedule`` maps check layer -> ratio of reused tokens kept.
    ``spread``: from the first check layer on, each stale reused row moves by that share of its
    chunk's recomputed rows' mean deviation (``spread.py``; 0: off).

    ``fresh_check``: at a check layer every row still active has fresh K/V already (they were
    computed to compare them with the cache), so keep them all for that layer's attention and
    cache instead of falling back to the cached K/V of the rows the selector drops.

    A selector with ``two_stage`` set (``QuestionSelector``), or whose ``stage_one_for`` says so of
    this prompt (``LexicalQuestionSelector``), runs the two-stage blend (the module docstring,
    ``_two_stage``): ``schedule``'s last ratio is its recompute ratio, its check layers and
    ``fresh_check`` play no part (unless the selector sets ``at_check_layers``)."""
    if inp.head and not bool(inp.reused.any()):  # no chunk reused: only the head is read (prefix caching)
        return reuse_pass(model, inp)
    staged = getattr(selector, "stage_one_for", None)
    if getattr(selector, "two_stage", False) or (staged and staged(
            inp.ids, inp.reused, inp.chunk_offsets, Check.of(inp, selector).asking, inp.first_alone)):
        return _two_stage(model, inp, selector, schedule, fresh_check, spread)
    return _blend(model, inp, selector, schedule, fresh_check, restart=inp.restart, spread=spread)


def _blend(model: ModelAdapter, inp: BlendInput, selector: Selector, schedule: dict[int, float], fresh_check=False,
           observe: QuestionScore | None = None, base: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
           question_score: torch.Tensor | None = None, restart: Restart | None = None,
           spread: float = 0.0, room: int = 0) -> BlendOutput:
    """The one-pass blend, with what the two-stage blend adds: ``observe`` (layer, q [1,H,n,d]
    rotated, keys [1,Hkv,N,d], the n rows' positions) at every layer; ``base``, per layer the K and
    V [Hkv,N,d] of an earlier pass to start the cache from (written in place) instead of realigning
    the cached K/V; ``question_score`` [N], handed to the selector in ``Candidates``. ``restart``:
    rows that join the active ones at its layer (``_join``). ``room``: each new cache has room for
    that many rows after the prompt's (``BlendOutput.grown``)."""
    n = inp.ids.shape[0]
    pos = torch.arange(n, device=inp.ids.device)  # [N]
    tables = RopeTables.at(model, pos)  # per rotary geometry: cos, sin [N, d]
    check = Check.of(inp, selector, question_score)
    if not inp.head and (inp.cached is None or check.num_reused == 0):
        schedule = {}
    first_check = min(schedule, default=model.num_layers)
    if restart is not None and schedule and restart.layer <= first_check:
        raise ValueError(f"restart layer {restart.layer} must come after the first check layer {first_check}")
    feed = None  # copies start now
    if schedule and base is None and inp.cached is not None:
        feed = LayerFeed(inp.cached, inp.ids.device, first_check)
    rows = Rows.at(pos, tables)
    spreading = DeviationSpread.of(inp.reused, inp.chunk_offsets, spread) if inp.cached is not None else None
    h = model.embed(inp.ids[None])  # [1, n, hidden]
    kv: list[tuple[torch.Tensor, torch.Tensor]] = []
    active_rows, auto, grown = [], {}, []  # auto: what an auto budget chose (budget.resolve)
    for layer in range(model.num_layers):
        if restart is not None and layer == restart.layer:
            rows, h = _join(rows, h, restart, tables)
        cos, sin = tables.layer(layer)  # [N, d]: this layer's rotary geometry
        x = model.attn_input(layer, h)  # [1, n, hidden]
        k, v = model.kv(layer, x)  # [1,Hkv,n,d], k before RoPE
        if layer < first_check:
            keys, values = apply_rope(k, cos, sin), v  # [1,Hkv,N,d]: full prefill, every row fresh
        else:
            if base is None:
                if feed is None:  # nothing reused, only a head: its rows, the rest computed
                    cached, buffer = None, k.new_zeros((2, k.shape[1], n + room, k.shape[3]))
                else:
                    cached = feed.layer(layer)  # [2,Hkv,N,d] store dtype, keys before RoPE; read-only
                    buffer = realign(cached, cos, sin, k.dtype, room)  # [2,Hkv,N+room,d]
                layer_kv = buffer[:, :, :n]  # [2,Hkv,N,d]: this layer's decode cache
                if room:
                    grown.append(buffer)
                if inp.head_kv is not None:  # the head's exact K/V
                    layer_kv[:, :, : inp.head] = inp.head_kv[layer]
            else:  # an earlier pass's cache: the cached K/V realigned, that pass's rows written
                layer_kv = base[layer]  # (K [Hkv,N,d], V [Hkv,N,d])
                cached = inp.cached[layer].to(inp.ids.device) if layer in schedule or spreading else None
            if layer in schedule:
                here = CheckLayer(model, layer, x, k, v, cached, layer_kv)
                ratio, signal = resolve(schedule[layer], here, check, rows)  # an AutoRatio: per request
                auto = auto if signal is None else dict(ratio=ratio, budget_signal=signal)
                pick = check.pick(here, rows, budget_for(ratio, check.num_reused))  # into active
                if fresh_check:  # every active row has fresh K/V: all of them stay in the cache
                    _write(layer_kv, k, v, rows, layer)
                rows, x, h = rows.take(pick, tables), x[:, pick], h[:, pick]
                k, v = k[:, :, pick], v[:, :, pick]
            _write(layer_kv, k, v, rows, layer)
            if spreading is not None and cached is not None:
                spreading.apply(layer_kv, (k, v), rows.active, cached, (cos, sin))
            keys, values = layer_kv[0][None], layer_kv[1][None]  # [1,Hkv,N,d]
        q = apply_rope(model.q(layer, x), *rows.rope.layer(layer))  # [1,H,n,d], only the rows kept
        if observe is not None:
            observe(layer, q, keys, rows.active)
        h = model.finish(layer, h, attend_rows(model, layer, q, keys, values, rows.plan))
        kv.append((keys, values))
        active_rows.append(rows.active)
    logits = model.logits(h[0, -1])  # active[-1] == N-1, kept always
    return BlendOutput(kv=kv, logits=logits, recomputed=active_rows[-1].shape[0], active_rows=active_rows,
                       grown=grown, **auto)


def _two_stage(model: ModelAdapter, inp: BlendInput, selector: Selector, schedule: dict[int, float],
               fresh_check: bool, spread: float = 0.0) -> BlendOutput:
    """Stage 1: the full-reuse pass (the uncached rows but the head's, and the last row, from layer
    0, over the realigned cached K/V), scoring the question rows' attention at the selector's
    layers. Stage 2: from layer 0 again, over stage 1's caches, the uncached rows, the last row and the selector's
    ``budget_for(ratio, reused)`` reused tokens by the fused score, at every layer; or, with
    ``at_check_layers`` (``QuestionDeviationSelector``), the one-pass blend of ``schedule``. At a
    budget of 0 stage 1 is the whole blend (nothing is scored): exactly the ratio-0.0 blend."""
    num_reused = int(inp.reused.sum())
    if inp.cached is None or num_reused == 0 or not schedule:
        return _blend(model, inp, selector, {})  # nothing to reuse: a full prefill
    ratio = schedule[max(schedule)]  # the last check layer's: the recompute ratio
    if budget_for(getattr(ratio, "max_ratio", ratio), num_reused) == 0:  # an AutoRatio: its most
        return reuse_pass(model, inp)  # full reuse
    started = time.perf_counter()
    first, asked = _first_stage(model, inp, selector)
    score = asked.score(inp.reused, inp.chunk_offsets)  # [N]
    if score.device.type == "cuda":
        torch.cuda.synchronize(score.device)
    first_stage_s = time.perf_counter() - started
    margins = getattr(asked, "margins", None)  # a drafted answer's (``draft.py``)
    draft_margin = min(margins) if margins else None
    ratio, signal = after_stage_one(ratio, draft_margin)  # an auto budget that reads stage 1 picks here
    base = [(k[0], v[0]) for k, v in first.kv]  # [Hkv,N,d] views of stage 1's caches, written in place
    if getattr(selector, "at_check_layers", False):
        out = _blend(model, inp, selector, schedule, fresh_check, base=base, question_score=score, restart=inp.restart,
                     spread=spread)
    else:
        out = _blend(model, inp, selector, {0: ratio}, base=base, question_score=score, restart=inp.restart,
                     spread=spread)
    out.first_stage_rows, out.first_stage_active = first.recomputed, first.active_rows
    out.question_rows, out.question_layers, out.drafted = asked.rows, asked.layers, first.drafted
    out.first_stage_s = first_stage_s
    if signal is not None:
        out.ratio, out.budget_signal = ratio, signal
    out.draft_margin, out.draft = draft_margin, list(getattr(asked, "draft", []))
    return out


def reuse_pass(model: ModelAdapter, inp: BlendInput, observe: QuestionScore | None = None, room: int = 0) -> BlendOutput:
    """The full-reuse pass (ratio 0.0 from layer 0, no layer-0 prelude: the uncached rows but the
    head's, and the last row), with ``observe`` called at every layer as ``_blend`` does; ``room``:
    rows its caches keep free after the prompt's (``BlendOutput.grown``)."""
    return _blend(model, inp, NoneSelector(), {0: 0.0}, observe=observe, room=room)


def _first_stage(model: ModelAdapter, inp: BlendInput, selector: Selector) -> tuple[BlendOutput, QuestionScore]:
    """Stage 1 and its score: the full-reuse pass observed by the question rows' ``QuestionScore``.
    A selector's own ``first_stage(model, inp)`` replaces it (``DraftSelector``, ``draft.py``: the
    rows of a drafted answer scored); it returns stage 1's output over the prompt's N rows
    (``recomputed``: every row its passes computed) and a score whose ``score`` is [N]."""
    own = getattr(selector, "first_stage", None)
    if own is not None:
        return own(model, inp)
    asked = QuestionScore(model, Check.of(inp, selector).asking, selector.fusion)
    return reuse_pass(model, inp, asked), asked


def _join(rows: Rows, h: torch.Tensor, restart: Restart, tables: RopeTables) -> tuple[Rows, torch.Tensor]:
    """The active rows and ``restart``'s rows not among them, sorted, with their hidden states
    [1, n', hidden] (the restarted rows' from ``restart.hidden``)."""
    new = ~torch.isin(restart.positions, rows.active)  # [r]
    active = torch.cat([rows.active, restart.positions[new]])
    order = torch.argsort(active)
    h = torch.cat([h[0], restart.hidden[new].to(h.dtype)])[order][None]
    return Rows.at(active[order], tables), h


def _write(layer_kv: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: Rows, layer: int) -> None:
    """Fresh K (rotated here) and V [1,Hkv,n,d] of ``rows`` into ``layer``'s cache [2,Hkv,N,d]."""
    layer_kv[0].index_copy_(1, rows.active, apply_rope(k[0], *rows.rope.layer(layer)))
    layer_kv[1].index_copy_(1, rows.active, v[0])
