"""Where a chunk's two records disagree: a staleness signal that costs no model compute.

    .venv/bin/python benchmarks/record_gap.py --dataset facts --split dev --count 60 --threads 1 --methods "nb1 reuse,nb1 deviation,nb1 gap,nb1 draft-only 8 last3,nb1 draft-only 8 last3 gap x" --run-file gap.json
    .venv/bin/python benchmarks/record_gap.py --quick     # 1 dev fact question: deviation and the gap

With lead records (the default warming) every chunk has two records: its lead record, warmed behind
the chunk context alone, and its record warmed behind its most similar passage. A row whose V moves
between those two contexts depends on what precedes it; in a prompt, where other passages precede
it, it is among the likeliest to be stale. The *gap* of a reused row is that move, summed over the
layers, each layer scaled by its mean squared V norm (``cacheblend.blending.gap``, the product's:
``record_gap`` here reads both records as the engine does). It needs no forward pass. The prompt's
first chunk reads its lead record, which nothing but the head precedes, as in full prefill: its gap
is 0.

CacheBlend's deviation measures staleness at one check layer, after a full layer-0 prelude. The
draft selector (``draft.py``) scores by importance: the attention a drafted answer pays each row,
whether or not the row is stale. The methods here (select_eval.py's harness, its tables and run
files; development data only):

- ``"nb1 gap"``: the default's records, 15% of the reused rows by the gap, in the one-pass blend
  at check layer 0 (the selector reads no fresh K/V, so no prelude is needed; the layer-0 K/V
  projections of every row are still computed there).
- ``"nb1 draft-only 8 last3 gap x"``: the draft (SmolLM2's default before stop 61) with its score
  multiplied by the gap: rows the answer reads *and* whose records disagree. Since stop 60 it is the
  product's ``BlendConfig(selector="draft+gap")``, SmolLM2's default since stop 61; the development
  runs before it (``docs/runs/gap_*``) ran this script's own product of the two, which it
  reproduces (docs/RECORD-GAP.md). ``"nb1 draft-only T last3 gap x"`` (T in 12, 16, 24): the same
  with a draft of T tokens (``draft_tokens=T``); ``"nb1 draft-only 8 last3 gap x P%"`` (P in 5, 8,
  10, 20, 30, 50): the default at P% instead of 15%, what an adaptive budget picks among
  (benchmarks/gate_eval.py ``--choose``); ``"nb1 draft+gap auto LO-HI% <M"``: the adaptive budget
  that picks between them (``auto_signal="draft_doubt"``): HI% where full reuse's draft has a token
  it is less than M sure of (``BlendStats.draft_margin`` below M), LO% elsewhere. ``"... gap W"``:
  W x the draft's rank plus (1 - W) x the gap's rank.
- ``"nb1 lexical gap"``: the named chunk whole, the rest of 15% by the gap instead of deviation
  (``"nb1 lexical"``'s control).
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass, field, replace

import torch

import select_eval
from cacheblend.blending.draft import DraftSelector
from cacheblend.blending.gap import record_gap as product_gap
from cacheblend.blending.lexical import LexicalSelector
from cacheblend.blending.selection import Candidates, _rank, _top
from cacheblend.config import BlendConfig
from cacheblend.prompts.assemble import assemble, chunk_encodings


def record_gap(engine, request) -> torch.Tensor:
    """[N] fp32: each prompt row's gap as the product computes it (``cacheblend.blending.gap``),
    between the records the default reads and the lead records; zeros where there is none."""
    chunks = chunk_encodings(request.text, engine.kv.encode)
    ids = [list(c.ids) for c in chunks]
    records = engine.kv.records(ids)
    asm = assemble(request.text, request.encoding, chunks, records, engine.adapter.device, True)
    gap = product_gap(asm.places, records, engine.kv.records(ids, lead_from=0), len(request.ids))
    return torch.zeros(len(request.ids)) if gap is None else gap


@dataclass
class GapState:
    gap: torch.Tensor | None = None  # [N] of the prompt being blended (``prepare``)

    def of(self, cand: Candidates) -> torch.Tensor:
        return self.gap.to(cand.positions.device)[cand.positions.long()]


class ReadsGap:
    """What select_eval's ``prepare`` hook calls per prompt: the prompt's gap into ``self.state``."""

    def prepare(self, engine, request) -> None:
        self.state.gap = record_gap(engine, request)


@dataclass(frozen=True)
class GapSelector(ReadsGap):
    """The reused rows of largest gap."""

    state: GapState = field(default_factory=GapState, compare=False)
    needs_query = False

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        return _top(self.state.of(cand), budget)


@dataclass(frozen=True)
class DraftRankGapSelector(ReadsGap, DraftSelector):
    """The draft's score and the gap by weighted rank: ``weight`` x the draft's rank plus (1 - ``weight``)
    x the gap's (the product's ``draft+gap`` multiplies them instead)."""

    weight: float = 0.5
    state: GapState = field(default_factory=GapState, compare=False)

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        draft, gap = cand.question_score.float(), self.state.of(cand)
        return _top(self.weight * _rank(draft) + (1 - self.weight) * _rank(gap), budget)


@dataclass(frozen=True)
class LexicalGapSelector(ReadsGap, LexicalSelector):
    """The named chunk whole, the rest of the budget by the gap (``LexicalSelector`` with the gap in
    deviation's place)."""

    state: GapState = field(default_factory=GapState, compare=False)

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        budget = min(budget, cand.positions.numel())
        gap = self.state.of(cand)
        named = _top(self.scores(cand, gap), round(budget * self.share))
        if named.numel() >= budget:
            return named
        rest = gap.clone()
        rest[named] = -1.0
        return torch.cat([named, _top(rest, budget - named.numel())])


def register() -> None:
    """Adds the module docstring's methods to select_eval's."""
    one_pass = BlendConfig(neighbours=1, check_layers=(0,))
    select_eval.METHODS["nb1 gap"] = (one_pass, GapSelector())
    select_eval.METHODS["nb1 lexical gap"] = (BlendConfig(selector="lexical", neighbours=1), LexicalGapSelector())
    drafting = select_eval.METHODS["nb1 draft-only 8 last3"][0]
    for tokens in (8, 12, 16, 24):
        select_eval.METHODS[f"nb1 draft-only {tokens} last3 gap x"] = (
            replace(drafting, selector="draft+gap", draft_tokens=tokens), None)
    for percent in (5, 8, 10, 20, 30, 50):  # the default at other budgets (an adaptive budget's choices)
        select_eval.METHODS[f"nb1 draft-only 8 last3 gap x {percent}%"] = (
            replace(drafting, selector="draft+gap", draft_tokens=8, ratios=(percent / 100,)), None)
    for lo, hi, margin in itertools.product((5, 10), (20, 30), (0.05, 0.1, 0.15, 0.2, 0.3)):  # the adaptive budget
        select_eval.METHODS[f"nb1 draft+gap auto {lo}-{hi}% <{margin:g}"] = (replace(
            drafting, selector="draft+gap", draft_tokens=8, auto_budget=True, auto_signal="draft_doubt",
            auto_min_ratio=lo / 100, auto_max_ratio=hi / 100, auto_threshold=1 - margin), None)
    for w in (0.25, 0.5, 0.75):
        select_eval.METHODS[f"nb1 draft-only 8 last3 gap {w}"] = (drafting, DraftRankGapSelector("last_third", tokens=8,
                                                                                                weight=w))


def main(argv: list[str] | None = None) -> None:
    import draft_score

    draft_score.register()
    register()
    select_eval.main_with(__doc__, "nb1 deviation,nb1 gap", sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    main()
