"""The adaptive recompute budget (``recompute_ratio="auto"``): per request, how many reused tokens
to recompute, decided at the check layer from what the blend has computed there, before the
selector picks (docs/ADAPTIVE-BUDGET.md).

``resolve`` is what ``blend.py`` calls at a check layer: a fixed ratio passes through; an
``AutoRatio`` (``BlendConfig.schedule`` with ``auto_budget``) reads its signal and maps it to a
ratio in [min_ratio, max_ratio]. The signals (``SIGNALS``, names in ``config.BUDGET_SIGNALS``):

- ``deviation``: the check layer's V deviation of the reused tokens, fresh vs cached, relative to
  the cached V (sum of squared differences over the sum of squares);
- ``concentration``: the share of that deviation held by the top 15% of the reused tokens;
- ``attention_other``: of the attention the question rows pay the reused tokens at the check layer
  (mean over heads), the share outside the chunk that gets the most;
- ``attention_entropy``: the entropy of that attention over the chunks, divided by log(chunks);
- ``cached_share``: reused tokens over prompt tokens; ``chunks``: the number of reused chunks;
- ``named_share``: the share of the reused tokens in the chunk the question names most (the
  lexical selector's chunk score, ``lexical.chunk_scores``; 0, hence the lower bound, when that
  chunk is the prompt's first read alone: ``lexical.named_chunk``): a ratio itself
  (``SHARE_SIGNALS``), so the budget recomputes that chunk whole, whatever its length.

``after_stage_one`` is what a two-stage blend calls between its stages: a ``STAGE_SIGNALS`` policy
reads the first stage there, not a check layer: ``draft_doubt``, 1 minus how sure full reuse was of
a drafted answer's least sure token (``draft.py``'s ``DraftScore.margins``; ``BlendStats.draft_margin``).
Where full reuse doubts its own answer, the blend is likeliest to answer otherwise than full reuse
and full prefill do (docs/ADAPTIVE-BUDGET.md).

``recording()`` collects every signal at each auto choice (for measurement: benchmarks/budget_eval.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..config import BUDGET_SIGNALS, STAGE_SIGNALS, AutoRatio
from .lexical import named_share
from .question import chunk_ids

TOP_SHARE = 0.15  # ``concentration``: the share of the reused tokens whose deviation is summed


@dataclass
class CheckView:
    """What the signals read at a check layer. v_fresh, v_cached: [Hkv, n, d] fp32 V of the n reused
    rows; attention: a callable giving [H, m, N] question-row attention (computed only when asked);
    reused: [N] bool; chunks: [N] long, each reused token's chunk (-1 elsewhere); ids: [N] the
    prompt's token ids; asking: [N] bool, the question's rows; first_alone: ``BlendInput.first_alone``."""

    v_fresh: torch.Tensor
    v_cached: torch.Tensor
    attention: Callable[[], torch.Tensor]
    reused: torch.Tensor
    chunks: torch.Tensor
    ids: torch.Tensor
    asking: torch.Tensor
    first_alone: bool = False

    def deviation_per_token(self) -> torch.Tensor:
        return (self.v_fresh - self.v_cached).pow(2).sum(dim=(0, 2))  # [n]


def deviation(view: CheckView) -> float:
    total = float(view.v_cached.pow(2).sum())
    return float(view.deviation_per_token().sum()) / max(total, 1e-30)


def concentration(view: CheckView) -> float:
    dev = view.deviation_per_token()
    top = max(1, math.ceil(TOP_SHARE * dev.numel()))
    return float(torch.topk(dev, top).values.sum()) / max(float(dev.sum()), 1e-30)


def chunk_spread(mass: torch.Tensor, chunks: torch.Tensor) -> tuple[float, float]:
    """mass: [N] attention per prompt token; chunks: [N] (-1 for uncached). The share of the
    reused tokens' mass outside the chunk holding the most, and the entropy of the mass over the
    chunks divided by log(number of chunks) (0 with one chunk)."""
    mine = chunks >= 0
    count = int(chunks.max()) + 1 if bool(mine.any()) else 0
    if count == 0:
        return 0.0, 0.0
    per_chunk = torch.zeros(count, dtype=torch.float64, device=mass.device)
    per_chunk.scatter_add_(0, chunks[mine], mass[mine].double())
    total = float(per_chunk.sum())
    if total <= 0 or count == 1:
        return 0.0, 0.0
    p = per_chunk / total
    entropy = float(-(p * p.clamp_min(1e-300).log()).sum()) / math.log(count)
    return 1.0 - float(p.max()), entropy


def _attention_mass(view: CheckView) -> torch.Tensor:
    return view.attention().mean(dim=0).sum(dim=0)  # [N]: mean over heads, summed over question rows


SIGNALS: dict[str, Callable[[CheckView], float]] = {
    "deviation": deviation,
    "concentration": concentration,
    "attention_other": lambda view: chunk_spread(_attention_mass(view), view.chunks)[0],
    "attention_entropy": lambda view: chunk_spread(_attention_mass(view), view.chunks)[1],
    "cached_share": lambda view: float(view.reused.float().mean()),
    "chunks": lambda view: float(int(view.chunks.max()) + 1 if bool((view.chunks >= 0).any()) else 0),
    "named_share": lambda view: named_share(view.ids[view.reused], view.chunks[view.reused], view.ids[view.asking],
                                            view.first_alone),
}
assert tuple(SIGNALS) + STAGE_SIGNALS == BUDGET_SIGNALS

_recorded: list[dict[str, float]] | None = None


@contextmanager
def recording() -> Iterator[list[dict[str, float]]]:
    """Within it, every auto choice appends all the signals (and ``ratio``) to the yielded list.
    Not thread-safe: for measurement scripts, not for serving."""
    global _recorded
    before, _recorded = _recorded, []
    try:
        yield _recorded
    finally:
        _recorded = before


def resolve(spec: float | AutoRatio, at, check, rows) -> tuple[float, float | None]:
    """The ratio to use at this check layer, and the signal value it came from (None when fixed).
    ``at``, ``check``, ``rows``: check.py's ``CheckLayer`` and ``Check``, rows.py's ``Rows``."""
    if not isinstance(spec, AutoRatio):
        return float(spec), None
    view = _view(at, check, rows)
    value = SIGNALS[spec.signal](view)
    ratio = spec.ratio(value)
    if _recorded is not None:
        attention = _cached(view.attention)
        view.attention = attention
        _recorded.append({**{name: fn(view) for name, fn in SIGNALS.items()}, "ratio": ratio})
    return ratio, value


def after_stage_one(spec: float | AutoRatio,
                    draft_margin: float | None) -> tuple[float | AutoRatio, float | None]:
    """The ratio a two-stage blend's stage 2 uses, and the signal it came from: a ``STAGE_SIGNALS``
    policy's pick from stage 1's ``draft_margin`` (its draft's least sure token's margin); anything
    else passes through, with None (a check-layer policy resolves at stage 2's check layer)."""
    if not isinstance(spec, AutoRatio) or spec.signal not in STAGE_SIGNALS:
        return spec, None
    value = 1.0 - draft_margin  # draft_doubt (config refuses it without a draft selector)
    return spec.ratio(value), value


def _view(at, check, rows) -> CheckView:
    reused = check.inp.reused
    mine = reused[rows.active]  # [n] bool: the active rows that are reused
    tokens = rows.active[mine]
    return CheckView(
        v_fresh=at.v[0][:, mine].float(),
        v_cached=at.cached[1][:, tokens].float(),
        attention=_cached(lambda: check._query_attention(at, rows)),
        reused=reused,
        chunks=chunk_ids(reused, check.inp.chunk_offsets),
        ids=check.inp.ids,
        asking=check.asking,
        first_alone=check.inp.first_alone,
    )


def _cached(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    box: list[torch.Tensor] = []

    def get() -> torch.Tensor:
        if not box:
            box.append(fn())
        return box[0]

    return get
