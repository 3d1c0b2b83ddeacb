"""Which chunk to recompute whole, by the attention the question pays it: select_eval with methods
whose named chunk comes from a first, full-reuse pass over every layer (ProphetKV's stage 1, the
question selector's: blending/question.py), not only from the question's token ids.

    .venv/bin/python benchmarks/attention_chunk.py --model qwen2.5-0.5b-instruct --dataset ../shared/data/musique_s.json --split dev --count 25 --threads 2 --answer-tokens 24 --pool corpus --methods "nb1 reuse,nb1 lexical named,nb1 attention ties,nb1 attention chunk"

The lexical selector names the chunk holding the most of the question's rarer token ids; on
MuSiQue two chunks often hold them alike (a tie: benchmarks/named_ties.py) and the passage a
multi-hop answer comes from is often named by no token of the question at all. Stage 1 runs the
question's rows (and every uncached row) through all layers over the realigned records and sums,
per chunk, the attention those rows pay its tokens (``question.Fusion``: mean over heads, over the
last third of the layers; the methods ending in " all": over every layer). Then the one-pass blend
of the product's named-chunk budget (``"nb1 lexical named"``: a layer-0 prelude, check layer 1) recomputes:

- ``"nb1 attention ties"``: the lexical named chunk, a tie broken by the stage-1 mass (the first
  chunk read alone never named); where the question names none, 5% by V deviation, as the product;
- ``"nb1 attention chunk"``: the chunk the question's stage-1 attention reads most, whole,
  whatever its tokens (the first chunk read alone never named: then the next);
- ``"nb1 attention chunk+named"``: that chunk and the lexical named chunk (a measurement: two
  chunks where they differ);
- ``"nb1 named else question 5%"`` (8%, 10%, 15%): the product's named chunk (``lexical.named_chunk``:
  a tie names the first, the first chunk read alone none), and where it names none, that share of
  the reused tokens by the question's stage-1 score (the question selector's, last third) in
  place of the product's 5% by V deviation. The product's version is ``selector="lexical+question"``
  (``"nb1 lexical+question 8%"`` in select_eval: stage 1 on those prompts only); this one stays to
  rerun the development figures it made (docs/QUESTION-SELECTOR.md).

The stage-1 pass is extra cost the product's named chunk does not pay (only the uncached rows,
every layer; select_eval's ``time`` column includes it).
"""

from __future__ import annotations

import sys

from named_ties import FLOOR  # where no chunk is named: the named chunk's budget's lower bound, by V deviation

HOWS = ("ties", "chunk", "chunk+named", "named")


class AttentionChunk:
    """The chunk(s) recomputed whole by ``how`` (one of ``HOWS``, above), from stage 1's score."""

    needs_query = False
    two_stage = True
    at_check_layers = True  # stage 2 is the one-pass blend of the config's schedule (check layer 1)

    def __init__(self, how: str, layers: str = "last_third", floor: float | None = None) -> None:
        from cacheblend.blending.question import Fusion

        if how not in HOWS:
            raise ValueError(f"how must be one of {', '.join(HOWS)}, not {how!r}")
        self.how, self.fusion, self.floor = how, Fusion(layers, "mean", False), floor

    def named(self, lexical, mass, first_alone: bool) -> list[int]:
        """The chunks to recompute. lexical: [chunks] ``chunk_scores``; mass: [chunks] stage-1 attention."""
        if self.how == "named":
            from cacheblend.blending.lexical import named_chunk

            best = named_chunk(lexical, first_alone)
            return [] if best is None else [best]
        allowed = [c for c in range(mass.numel()) if not (c == 0 and first_alone)]
        best = float(lexical.max()) if lexical.numel() else 0.0
        tied = [c for c in allowed if best > 0 and float(lexical[c]) == best]
        by_mass = max(allowed, key=lambda c: float(mass[c]), default=None)
        if self.how == "ties":
            return [max(tied, key=lambda c: float(mass[c]))] if tied else []
        if self.how == "chunk":
            return [] if by_mass is None else [by_mass]
        return sorted({c for c in (by_mass, tied[0] if tied else None) if c is not None})

    def __call__(self, cand, budget: int):
        import torch

        from cacheblend.blending.lexical import chunk_scores
        from cacheblend.blending.selection import DeviationSelector, _top

        if cand.question_score is None:
            raise ValueError("AttentionChunk needs a two-stage blend (Candidates.question_score)")
        chunk = cand.chunks()  # [n]
        count = int(chunk.max()) + 1
        mass = torch.zeros(count, dtype=torch.float64).index_add_(0, chunk.cpu(), cand.question_score.double().cpu())
        named = self.named(chunk_scores(cand.ids, chunk, cand.question_ids), mass, cand.first_alone)
        if named:
            return torch.isin(chunk, torch.tensor(named, device=chunk.device)).nonzero().flatten()
        if self.floor is not None:  # the question's stage-1 score picks the floor's tokens
            return _top(cand.question_score, round(self.floor * cand.positions.numel()))
        return _top(DeviationSelector("v").scores(cand), round(FLOOR * cand.positions.numel()))


def register() -> None:
    import select_eval

    config = select_eval.METHODS["nb1 lexical named"][0]
    for how in HOWS[:-1]:  # "named" is registered with its floors below
        select_eval.METHODS[f"nb1 attention {how}"] = (config, AttentionChunk(how))
        select_eval.METHODS[f"nb1 attention {how} all"] = (config, AttentionChunk(how, "all"))
    for floor in (5, 8, 10, 15):
        select_eval.METHODS[f"nb1 named else question {floor}%"] = (config, AttentionChunk("named", floor=floor / 100))


def main(argv: list[str] | None = None) -> None:
    import select_eval

    register()
    argv = sys.argv[1:] if argv is None else argv
    select_eval.main_with(__doc__, "nb1 lexical named,nb1 attention ties,nb1 attention chunk", argv)


if __name__ == "__main__":
    main()
