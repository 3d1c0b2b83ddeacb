"""How often a question names two chunks alike: the lexical selector's ties, counted.

    .venv/bin/python benchmarks/named_ties.py --tally --model qwen2.5-0.5b-instruct --dataset ../shared/data/musique_s.json --split report --count 100
    .venv/bin/python benchmarks/named_ties.py --tally --model qwen2.5-0.5b-instruct --bench pydoc --count 8   # cacheblend bench's prompts
    .venv/bin/python benchmarks/named_ties.py --tally --quick     # 3 dev fact questions on the given model

The lexical selector scores each chunk by the question's rarer token ids it holds
(``lexical.chunk_scores``); the chunk with the best score is recomputed whole and the named-share
budget is sized for it (``lexical.named_chunk``). Where two chunks share the best score (a
multi-hop question names an entity two passages hold), the choice is a tie-break: ``--tally``
counts, per set, the prompts where it is one, and which chunks tie. It tokenizes only (no
prefill, no warming): chunks as the engine encodes them, the question as the text after the last
chunk, encoded the same way (``lexical.named_before_blend``'s view). The sets are select_eval.py's
(``--dataset``, ``--split``, ``--start``, ``--count``) or, with ``--bench pydoc|musique``, the
prompts of ``cacheblend bench`` (MuSiQue from ``--start``).

Without ``--tally`` it is select_eval.py with five more methods, the tie-breaks the product
could make (it names the first of the tied chunks, ``"nb1 lexical named"``, the same rows as
``"nb1 named ties first"``):

    .venv/bin/python benchmarks/named_ties.py --model qwen2.5-0.5b-instruct --dataset ../shared/data/musique_s.json --split dev --count 25 --answer-tokens 24 --pool corpus --methods "nb1 lexical named,nb1 named ties first,nb1 named ties last,nb1 named ties none,nb1 named ties all,nb1 named ties deviation"

- ``"nb1 named ties first"``: the first of the tied chunks, whole;
- ``"nb1 named ties last"``: the last of them, whole (with the first chunk read alone among them,
  the last all the same);
- ``"nb1 named ties none"``: a tie names no chunk (5% by deviation, as where the question names none);
- ``"nb1 named ties all"``: every tied chunk, whole (a measurement: it recomputes what they hold);
- ``"nb1 named ties deviation"``: the tied chunk whose tokens' V deviates most from its record at
  the check layer, on average (whose reused KV is the furthest off), whole; the first chunk read
  alone never.

Each is the named chunk's budget otherwise (the chunk, whole; 5% by deviation where the question
names none or names the first chunk read alone; no upper bound), from the same records.
"""

from __future__ import annotations

import argparse
import sys

from runfile import RunRecord, add_common

TIES = ("first", "last", "none", "all", "deviation")
FLOOR = 0.05  # the named chunk's budget where the question names none (Qwen's default's auto_min_ratio)


class NamedTie:
    """The named chunk's rows with a tie broken by ``ties`` (one of ``TIES``, above)."""

    needs_query = False

    def __init__(self, ties: str) -> None:
        if ties not in TIES:
            raise ValueError(f"ties must be one of {', '.join(TIES)}, not {ties!r}")
        self.ties = ties

    def named(self, scores, first_alone: bool, deviation=None) -> list[int]:
        """The chunks recomputed whole; ``deviation``: [chunks] their mean V deviation ("deviation")."""
        best = float(scores.max()) if scores.numel() else 0.0
        top = [i for i, s in enumerate(scores.tolist()) if best > 0 and s == best]
        if self.ties == "none" and len(top) > 1:
            top = []
        if self.ties == "deviation":  # among the tied chunks recomputing can help; equal deviation: the last
            top = [c for c in top if not (c == 0 and first_alone)]
            top = [max(reversed(top), key=lambda c: float(deviation[c]))] if top else []
        top = top if self.ties == "all" else top[-1:] if self.ties == "last" else top[:1]
        return [c for c in top if not (c == 0 and first_alone)]

    def __call__(self, cand, budget: int):
        import torch

        from cacheblend.blending.lexical import chunk_scores
        from cacheblend.blending.selection import DeviationSelector, _top

        chunk = cand.chunks()  # [n]
        scores, dev = chunk_scores(cand.ids, chunk, cand.question_ids), DeviationSelector("v").scores(cand)  # [n]
        mean = torch.zeros(scores.numel(), dtype=dev.dtype).index_add_(0, chunk, dev) / torch.bincount(chunk)
        named = self.named(scores, cand.first_alone, mean)
        if named:
            return torch.isin(chunk, torch.tensor(named, device=chunk.device)).nonzero().flatten()
        return _top(dev, round(FLOOR * cand.positions.numel()))


def register() -> None:
    import select_eval

    config = select_eval.METHODS["nb1 lexical named"][0]
    for ties in TIES:
        select_eval.METHODS[f"nb1 named ties {ties}"] = (config, NamedTie(ties))


def prompt_scores(engine, chunks: list[str], query: str, prefix: str) -> list[float]:
    """``chunk_scores`` of one prompt, as the product sees it before any record is read."""
    import torch

    from cacheblend.blending.lexical import chunk_scores
    from cacheblend.prompts.assemble import chunk_encodings

    req = engine.request(chunks=chunks, query=query, prefix=prefix)
    enc = [c.ids for c in chunk_encodings(req.text, engine.kv.encode)]
    tail = req.text.text[req.text.chunks[-1].end:]
    ids = torch.tensor([t for c in enc for t in c], dtype=torch.long)
    chunk = torch.tensor([i for i, c in enumerate(enc) for _ in c], dtype=torch.long)
    return chunk_scores(ids, chunk, torch.tensor(list(engine.kv.encode(tail).ids), dtype=torch.long)).tolist()


def tied(scores: list[float]) -> list[int]:
    """The chunks sharing the best score when more than one does and it is above 0, else []."""
    best = max(scores, default=0.0)
    top = [i for i, s in enumerate(scores) if s == best]
    return top if best > 0 and len(top) > 1 else []


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--tally" not in argv:
        import select_eval

        register()
        select_eval.main_with(__doc__, "nb1 lexical named,nb1 named ties first,nb1 named ties none", argv)
        return
    argv.remove("--tally")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tally", action="store_true", help="count the ties (tokenization only) instead of blending")
    add_common(ap, quick="--tally: 3 development fact questions; else 1 with the product's and two tie-breaks")
    ap.add_argument("--dataset", default="facts", help="facts, pydoc, or a MuSiQue-format JSON path")
    ap.add_argument("--split", default="dev", choices=("dev", "report"))
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--bench", default=None, choices=("pydoc", "musique"),
                    help="cacheblend bench's prompts instead (musique: from --dataset's --start)")
    args = ap.parse_args(argv)
    if args.quick:
        args.dataset, args.split, args.count, args.start, args.bench = "facts", "dev", 3, 0, None
    record = RunRecord.start(args)

    import select_eval
    from cacheblend import shared_engine
    from cacheblend.tools.bench import QA_PREFIX
    from cacheblend.tools.datasets import load_musique, pydoc_passages, pydoc_workload

    engine = shared_engine(args.model)
    if args.bench == "pydoc":
        sets, prefix = pydoc_workload(pydoc_passages(engine.count_tokens, min_tokens=384), args.count, 6), QA_PREFIX
        asked = [q.question for q in sets]
    elif args.bench == "musique":
        sets = load_musique(args.dataset, 6)[args.start : args.start + args.count]
        prefix, asked = QA_PREFIX, [q.question for q in sets]
    else:
        sets = select_eval.examples(args.dataset, args.split, args.count, engine, args.start)
        prefix, asked = select_eval.PREFIX, [select_eval.ask(engine.tokenizer, q.question) for q in sets]
    rows = []
    for i, (q, query) in enumerate(zip(sets, asked)):
        scores = prompt_scores(engine, q.passages, query, prefix)
        rows.append({"index": args.start + i, "scores": [round(s, 4) for s in scores], "tied": tied(scores)})
        if rows[-1]["tied"]:
            print(f"#{args.start + i}: chunks {rows[-1]['tied']} tie; scores {[round(s, 2) for s in scores]}")
    ties = sum(bool(r["tied"]) for r in rows)
    first = sum(bool(r["tied"]) and r["tied"][0] == 0 for r in rows)
    print(f"{ties} of {len(rows)} prompts tie at the best score ({first} of them with the first chunk)")
    meta = {"dataset": args.bench or args.dataset, "split": None if args.bench else args.split, "start": args.start,
            "count": len(rows), "ties": ties, "ties_with_first": first}
    record.write(args.run_file, {"meta": meta, "prompts": rows})


if __name__ == "__main__":
    main()
