"""The named chunk plus the passage it leads to: a multi-hop question names its first hop only.

    .venv/bin/python benchmarks/named_bridge.py --dataset ../shared/data/musique_s.json --split dev --count 25 --threads 2 --answer-tokens 24 --pool corpus
    .venv/bin/python benchmarks/named_bridge.py --quick     # 1 dev fact question, the named chunk and its bridge

A MuSiQue question such as "Who founded the label that released X?" names its first hop (X's
passage), which the lexical selector recomputes whole. Its second hop (the label's passage) holds
no token of the question, only tokens of the first hop's passage, which names the label
(docs/LEXICAL-SELECTOR.md, "What to try next"). The bridge chunk is found the way the named one
is, one round later: of the other chunks, the one holding most of the named chunk's rare tokens
that the question lacks (``chunk_scores`` over them). The prompt's first chunk, read alone, is
never a bridge: recomputing it gives it no context it lacks (as ``named_chunk`` says of it).

- ``"nb1 named bridge"``: the named chunk whole and the bridge chunk whole;
- ``"nb1 named bridge N%"``: the named chunk whole and N% of the reused tokens from the bridge
  chunk, its most deviating (V);
- ``"nb1 named +N%"`` (benchmarks/named_plus.py): the same N% by V deviation from every other
  chunk: the control at the same recompute.

Where the question names no chunk, each method is the named chunk's config alone (5% by
deviation). Every other argument is select_eval.py's: the tables, run files and the full-prefill
reference are its.
"""

from __future__ import annotations

import sys

import torch

import select_eval
from cacheblend.blending.lexical import chunk_scores, named_chunk
from cacheblend.blending.selection import Candidates, DeviationSelector, _top
from named_plus import NamedPlusDeviation

SHARES = (5, 8)  # the bridge's and the control's N%


def bridge_chunk(ids: torch.Tensor, chunk: torch.Tensor, question_ids: torch.Tensor, named: int,
                 first_alone: bool) -> int | None:
    """The chunk holding most of chunk ``named``'s rarer ids that the question lacks (``chunk_scores``
    over them), ``named`` itself and a first chunk read alone left out; None where no other chunk
    holds any of them. ``ids``, ``chunk``: [n] the reused tokens' ids and chunks."""
    own = ids[chunk == named].unique()
    scores = chunk_scores(ids, chunk, own[~torch.isin(own, question_ids)])  # [chunks]
    scores[named] = 0.0
    if first_alone:
        scores[0] = 0.0
    return int(scores.argmax()) if float(scores.max()) > 0 else None


class NamedBridge:
    """The named chunk's budget (the chunk whole; 5% by deviation where the question names none) and
    the bridge chunk: whole (``share`` None) or ``share`` of the reused tokens from it, its most
    deviating."""

    needs_query = False

    def __init__(self, share: float | None = None) -> None:
        self.share = share

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        n = cand.positions.numel()
        chunk = cand.chunks()  # [n]
        deviation = DeviationSelector("v").scores(cand)  # [n], >= 0
        best = named_chunk(chunk_scores(cand.ids, chunk, cand.question_ids), cand.first_alone)
        if best is None:
            return _top(deviation, min(budget, n))
        named = (chunk == best).nonzero().flatten()
        rest = deviation.clone()
        rest[named] = -1.0  # not picked twice
        extra = max(0, min(budget, n) - named.numel())  # the named config's budget beyond the chunk
        bridge = bridge_chunk(cand.ids, chunk, cand.question_ids, best, cand.first_alone)
        if bridge is not None:
            inside = chunk == bridge
            take = int(inside.sum()) if self.share is None else min(int(inside.sum()), int(self.share * n + 0.5))
            rest[~inside] = -1.0
            picked = _top(rest, take)
            if extra:
                others = deviation.clone()
                others[named], others[picked] = -1.0, -1.0
                picked = torch.cat([picked, _top(others, extra)])
            return torch.cat([named, picked])
        return torch.cat([named, _top(rest, extra)])


def register() -> None:
    """Adds ``"nb1 named bridge"``, ``"nb1 named bridge N%"`` and the control ``"nb1 named +N%"`` for
    N in ``SHARES``, over the named chunk's config (its budget, its records)."""
    config = select_eval.METHODS["nb1 lexical named"][0]
    select_eval.METHODS["nb1 named bridge"] = (config, NamedBridge())
    for share in SHARES:
        select_eval.METHODS[f"nb1 named bridge {share}%"] = (config, NamedBridge(share / 100))
        select_eval.METHODS[f"nb1 named +{share}%"] = (config, NamedPlusDeviation(share / 100))


DEFAULT = "nb1 reuse,nb1 lexical named,nb1 named +8%,nb1 named bridge 8%,nb1 named bridge"


def main(argv: list[str] | None = None) -> None:
    register()
    select_eval.main_with(__doc__, DEFAULT, sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    main()
