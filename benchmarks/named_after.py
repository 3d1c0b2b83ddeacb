"""What the chunks after the named one hold: the named chunk recomputed whole with the chunks that follow it.

    .venv/bin/python benchmarks/named_after.py --model qwen2.5-0.5b-instruct --split dev --count 100 --methods "nb1 lexical named,nb1 named next,nb1 named after"
    .venv/bin/python benchmarks/named_after.py --quick     # 1 dev fact question, the named chunk and "nb1 named after"

On Qwen 0.5B's development facts the named chunk's budget (Qwen's default) loses the answers full
prefill gets right mostly where the passage the question names is the prompt's second: there it
is recomputed behind the first passage's lead record, exactly as full prefill computes it, and
four stale passages follow it. Recomputing it whole does not repair those: in full prefill they
have read the named passage, here they were warmed behind a neighbour of their own. This script
measures what recomputing them too is worth, and what it costs:

- ``"nb1 named next"``: the named chunk and the one after it, whole;
- ``"nb1 named after"``: the named chunk and every chunk after it, whole.

Both read the same records as ``"nb1 lexical named"`` (1 neighbour, lead records) and fall back to
its budget (5% by deviation) where the question names no chunk, or names the first one read
alone. They are measurements, not product options: the recompute they spend is whatever the
chunks hold (the ``recomputed`` column says it), above the goals' 15% mean. Every other argument
is select_eval.py's, so the tables, run files and the full-prefill reference are its.
"""

from __future__ import annotations

import sys

import torch

import select_eval
from cacheblend.blending.lexical import chunk_scores, named_chunk
from cacheblend.blending.question import chunk_ids
from cacheblend.blending.selection import Candidates, DeviationSelector


class NamedAfter:
    """The chunk the question names (``lexical.named_chunk``) and the ``after`` chunks that follow
    it (None: all of them), every token; deviation at the budget where it names none."""

    needs_query = False

    def __init__(self, after: int | None) -> None:
        self.after = after

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        chunk = chunk_ids(torch.ones_like(cand.chunk_offsets, dtype=torch.bool), cand.chunk_offsets)  # [n]
        best = named_chunk(chunk_scores(cand.ids, chunk, cand.question_ids), cand.first_alone)
        if best is None:
            return DeviationSelector("v")(cand, budget)
        last = int(chunk.max()) if self.after is None else best + self.after
        return ((chunk >= best) & (chunk <= last)).nonzero().flatten()


def register() -> None:
    """Adds the two methods to select_eval's, over the named chunk's config (its records, its budget)."""
    config = select_eval.METHODS["nb1 lexical named"][0]
    select_eval.METHODS["nb1 named next"] = (config, NamedAfter(1))
    select_eval.METHODS["nb1 named after"] = (config, NamedAfter(None))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    register()
    select_eval.__doc__ = __doc__  # what --help describes
    if "--quick" in argv:  # select_eval's quick run with this script's method (its --quick fixes the methods)
        argv = [a for a in argv if a != "--quick"]
        argv += ["--dataset", "facts", "--split", "dev", "--count", "1", "--answer-tokens", "8",
                 "--methods", "nb1 lexical named,nb1 named after"]
    select_eval.main(argv)


if __name__ == "__main__":
    main()
