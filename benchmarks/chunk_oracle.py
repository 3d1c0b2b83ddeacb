"""The best single passage to recompute, chosen knowing full prefill's answer: an upper bound.

    .venv/bin/python benchmarks/chunk_oracle.py --model qwen2.5-0.5b-instruct --dataset ../shared/data/musique_s.json --split dev --count 25 --threads 2 --answer-tokens 24 --pool corpus --methods "nb1 reuse,nb1 lexical+question 8%,nb1 lexical named,nb1 chunk 1,nb1 chunk 2,nb1 chunk 3,nb1 chunk 4,nb1 chunk 5" --run-file oracle.json
    .venv/bin/python benchmarks/chunk_oracle.py --best oracle.json    # the bound, from the run file; no model
    .venv/bin/python benchmarks/chunk_oracle.py --quick     # 1 dev fact question, passages 1 and 2 whole

Every selector measured so far (docs/LEXICAL-SELECTOR.md, docs/QUESTION-SELECTOR.md) spends most
of its budget on one passage: the one the question names, whole. On the generated facts the
answer's passage is known and recomputing it alone repaired none of Qwen's lost answers
(docs/ADAPTIVE-BUDGET.md, "What a lost answer needs recomputed"). MuSiQue's passages carry no such
label, so this script asks the question the other way round: for each prompt, recompute each
passage whole in turn (``"nb1 chunk C"``, C in prompt order from 0, over the named chunk's records:
1 neighbour, lead records; the question and every uncached row recomputed as always), and
``--best`` picks, per prompt, the passage whose blend comes closest to full prefill's answer
(highest answer F1 against it, then lowest KL). No policy that recomputes one whole passage can do
better than that pick; if it stays under a goal, the goal needs more than one passage per prompt.

The prompt's first passage reads its lead record, KV computed behind the prompt's head alone: the
context it has in the prompt. Recomputing it changes it only by the store's rounding, so the
default methods start at passage 1. Every other argument is select_eval.py's: the tables, run files
and the full-prefill reference are its.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import select_eval
from cacheblend.blending.selection import Candidates

CHUNKS = 6  # MuSiQue's prompts hold 6 passages (select_eval.examples), the generated facts 6 too


class ChunkWhole:
    """Recomputes every reused token of chunk ``index`` (prompt order from 0) and nothing else of the
    reused tokens, whatever the config's budget; none where the prompt has fewer chunks."""

    needs_query = False

    def __init__(self, index: int) -> None:
        self.index = index

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        return (cand.chunks() == self.index).nonzero().flatten()


def register() -> None:
    """Adds ``"nb1 chunk C"`` for C in 0..5 over the named chunk's config (its records)."""
    config = select_eval.METHODS["nb1 lexical named"][0]
    for index in range(CHUNKS):
        select_eval.METHODS[f"nb1 chunk {index}"] = (config, ChunkWhole(index))


def best_chunks(run: dict, prefix: str = "nb1 chunk ") -> dict:
    """Per question, the ``"nb1 chunk C"`` method closest to full prefill's answer (highest F1, then
    lowest KL, then the lowest C), from a run file's per-question rows; and the means over questions
    of that pick's F1, KL, recomputed share and same-answer count, beside every other method's."""
    rows = run["questions"]
    index = {m: int(m[len(prefix):]) for m in rows if m.startswith(prefix)}  # method -> C
    if not index:
        raise SystemExit(f"the run has no '{prefix}C' method: run it with --methods naming them")
    count = len(rows[next(iter(index))]["f1"])
    picks = [min(index, key=lambda m: (-rows[m]["f1"][i], rows[m]["kl"][i], index[m])) for i in range(count)]

    def means(chosen: list[str]) -> dict:
        """The means over questions of method ``chosen[i]``'s row on question i."""
        mean = {k: sum(rows[m][k][i] for i, m in enumerate(chosen)) / count for k in ("f1", "kl", "share")}
        return {**mean, "same": sum(bool(rows[m]["agree"][i]) for i, m in enumerate(chosen))}

    table = {m: means([m] * count) for m in rows if m != "full prefill"}
    table["best single chunk"] = means(picks)
    return {"picks": [index[m] for m in picks], "questions": count, "methods": table}


def print_best(path: str) -> None:
    """``--best``: the bound's table (markdown) from a run file, and each question's pick."""
    run = json.loads(Path(path).read_text())
    best = best_chunks(run)
    n = best["questions"]
    print(f"{path}: {n} questions ({run.get('meta', {}).get('dataset')}, {run.get('run', {}).get('model')})")
    print("| method | answer F1 vs full | same answer | mean KL | recomputed |\n|---|---|---|---|---|")
    for name, m in best["methods"].items():
        print(f"| {name} | {m['f1']:.3f} | {m['same']} of {n} | {m['kl']:.4f} | {m['share']:.1%} |")
    print("best chunk per question:", " ".join(map(str, best["picks"])))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--best" in argv:
        paths = argv[argv.index("--best") + 1:]
        if not paths:
            raise SystemExit("--best needs a run file of this script")
        for path in paths:
            print_best(path)
        return
    register()
    select_eval.main_with(__doc__, "nb1 reuse,nb1 chunk 1,nb1 chunk 2", argv)


if __name__ == "__main__":
    main()
