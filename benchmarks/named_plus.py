"""The named chunk, whole, plus the most deviating tokens of the rest: both selectors' gains at once?

    .venv/bin/python benchmarks/named_plus.py --model qwen2.5-0.5b-instruct --dataset pydoc --split dev --count 12 --methods "nb1 reuse,nb1 deviation,nb1 deviation 5%,nb1 lexical named,nb1 named +2%,nb1 named +5%"
    .venv/bin/python benchmarks/named_plus.py --quick     # 1 dev fact question, the named chunk and "nb1 named +2%"

Qwen 0.5B's default recomputes the chunk the question names, whole (``auto_signal="named_share"``):
on the generated facts it keeps far more answers than deviation at 15%, but on the pydoc and
MuSiQue benchmarks its KL is 1.5-1.8x deviation's (docs/bench_*_qwen.json before and after the
default changed): deviation's budget refreshes the most deviating tokens of every chunk (chunk
starts, sink-like tokens) that every answer token reads, the named chunk's none of the others'.
Deviation at 5% already buys most of deviation's KL on those sets. So:

- ``"nb1 named +N%"``: the named chunk's budget (the chunk, every token; 5% when the question
  names none, as the default), plus N% of the reused tokens by V deviation among the others;
- ``"nb1 named +2% in C"``: the same 2% from chunk C alone (prompt order from 0; where the question
  names no chunk, the 5% too): which chunk's most deviating tokens move a prompt.

The recompute is the named chunk's plus N points: the ``recomputed`` column says it. Every other
argument is select_eval.py's, so the tables, run files and the full-prefill reference are its.
"""

from __future__ import annotations

import sys

import torch

import select_eval
from cacheblend.blending.lexical import chunk_scores, named_chunk
from cacheblend.blending.selection import Candidates, DeviationSelector, _top


class NamedPlusDeviation:
    """The ``budget`` the named chunk's config gives (the named chunk, whole; or 5% by deviation
    where it names none) and ``extra`` of the reused tokens more, by V deviation, among the rest
    (``within``: among chunk ``within``'s tokens only, prompt order from 0, for a diagnosis)."""

    needs_query = False

    def __init__(self, extra: float, within: int | None = None) -> None:
        self.extra, self.within = extra, within

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        n = cand.positions.numel()
        chunk = cand.chunks()  # [n]
        best = named_chunk(chunk_scores(cand.ids, chunk, cand.question_ids), cand.first_alone)
        deviation = DeviationSelector("v").scores(cand)  # [n], >= 0
        named = (chunk == best).nonzero().flatten() if best is not None else deviation.new_zeros(0, dtype=torch.long)
        count = min(n, max(budget, named.numel()) + int(self.extra * n + 0.5))
        rest = deviation.clone()
        rest[named] = -1.0  # not picked twice
        if self.within is not None:
            rest[chunk != self.within] = -1.0
            count = min(count, named.numel() + int((rest >= 0).sum()))
        return torch.cat([named, _top(rest, count - named.numel())])


def register() -> None:
    """Adds ``"nb1 named +N%"`` for N in 1, 2, 3, 5 over the named chunk's config (its budget, its
    records), and ``"nb1 named +2% in C"``: the 2% from chunk C alone (0-9), to find the chunk whose
    most deviating tokens move a prompt."""
    config = select_eval.METHODS["nb1 lexical named"][0]
    for extra in (1, 2, 3, 5):
        select_eval.METHODS[f"nb1 named +{extra}%"] = (config, NamedPlusDeviation(extra / 100))
    for c in range(10):
        select_eval.METHODS[f"nb1 named +2% in {c}"] = (config, NamedPlusDeviation(0.02, within=c))


def main(argv: list[str] | None = None) -> None:
    register()
    select_eval.main_with(__doc__, "nb1 lexical named,nb1 named +2%", sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    main()
