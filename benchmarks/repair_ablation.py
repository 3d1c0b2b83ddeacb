"""Which passages' rows a lost answer needs recomputed: whole-passage ablations of the lost fact lookups.

    .venv/bin/python benchmarks/repair_ablation.py --model qwen2.5-0.5b-instruct --split dev --count 100
    .venv/bin/python benchmarks/repair_ablation.py --quick    # 1 development question, ablated whether lost or not

For each generated fact question (``cacheblend.tools.factset``) the model's default blend
(``BlendConfig.for_model``: its selector, its budget, 1 neighbour and lead records) answers beside
full prefill. Where full prefill is right and the default is wrong (an answer *lost*), the same
records are blended again with fixed sets of whole passages recomputed from layer 0 (every
uncached row and the last row always are) and the rest read from the default's records:

- ``answer``: the passage holding the answer (what the named chunk's budget recomputes, when the
  question names it);
- ``answer + P``: it and passage P;
- ``all but P``: every passage but P (``all but answer``: every passage but the answer's);
- ``all``: every passage, so every row is recomputed (each ablation computes the prompt's head too):
  a full prefill through the blend's path, the check that the path itself loses nothing.

The question this answers is whether a selection can repair these answers at all: a repair needs
some set of rows recomputed; if recomputing every passage but one still loses the answer, no
selector of a few percent can keep it, and the loss is spread over the stale records, not held by
a few tokens. The shares are of the prompt's tokens (recomputed, uncached rows included).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

from runfile import RunRecord, add_common


class Fixed:
    """A selector recomputing the reused rows at ``positions`` (prompt positions, a LongTensor), up to the budget."""

    needs_query = False

    def __init__(self, positions) -> None:
        self.positions = positions

    def __call__(self, cand, budget: int):
        import torch

        chosen = torch.isin(cand.positions.long(), self.positions).nonzero().flatten()
        return chosen[:budget]


def passage_rows(request) -> list:
    """The prompt positions of each passage's tokens (the tokens overlapping its span), in prompt order."""
    import torch

    offsets = request.encoding.offsets
    return [torch.tensor([i for i, (a, b) in enumerate(offsets) if b > s.start and a < s.end], dtype=torch.long)
            for s in request.text.chunks]


def ablations(rows: list, target: int) -> dict:
    """label -> prompt positions to recompute (see the module docstring)."""
    import torch

    every = range(len(rows))
    sets = {"answer": rows[target]}
    sets.update({f"answer + {j}": torch.cat([rows[target], rows[j]]) for j in every if j != target})
    sets.update({("all but answer" if j == target else f"all but {j}"): torch.cat([rows[i] for i in every if i != j])
                 for j in every})
    sets["all"] = torch.cat(rows)
    return sets


def summarize(cases: list[dict]) -> dict:
    """Per kind of ablation, how many lost answers some ablation of that kind repairs, and at what share."""
    kinds = {
        "the answer's passage": lambda label: label == "answer",
        "the answer's passage + one other (the best)": lambda label: label.startswith("answer + "),
        "every passage but the answer's": lambda label: label == "all but answer",
        "every passage but one other (the best)": lambda label: label.startswith("all but ")
        and label != "all but answer",
        "every passage": lambda label: label == "all",
    }
    out = {}
    for kind, match in kinds.items():
        repaired, shares, fixing = 0, [], []
        for case in cases:
            tried = [a for a in case["ablations"] if match(a["label"])]
            shares += [a["share"] for a in tried]
            good = [a for a in tried if a["right"]]
            repaired += bool(good)
            fixing += [len(good) / len(tried)] if tried else []
        out[kind] = {"repaired": repaired, "lost": len(cases), "mean_share": sum(shares) / max(1, len(shares)),
                     "share_of_tries_repairing": sum(fixing) / max(1, len(fixing))}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, quick="1 development fact question, ablated whether lost or not, 8 answer tokens")
    ap.add_argument("--split", default="dev", choices=("dev", "report"))
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--answer-tokens", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 suits shared CPUs)")
    args = ap.parse_args(argv)
    every = args.quick
    if args.quick:
        args.split, args.count, args.start, args.answer_tokens = "dev", 1, 0, 8
    record = RunRecord.start(args)

    import torch

    from cacheblend import BlendConfig, BlendEngine, shared_engine
    from cacheblend.prefilling import Prefiller
    from select_eval import PREFIX, STOP, _right, ask, examples

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    shared = shared_engine(args.model)
    default = BlendConfig.for_model(args.model)
    engine = BlendEngine(shared.adapter.model, shared.tokenizer, config=default, memory_bytes=8 << 30)
    qs = examples("facts", args.split, args.count, engine, args.start)
    pool = sorted({p for q in qs for p in q.passages})
    started = time.time()
    engine.kv.warmer.learn([], pool)  # the neighbours come from the run's passages, as in select_eval
    engine.warm(pool, progress=False)
    print(f"warmed {len(pool)} passages in {time.time() - started:.0f} s", flush=True)
    # the fixed sets from layer 0 (check layer 0: no prelude), over the default's records and warming; a budget
    # of 0.99999 covers every reused row (below 50,000 of them), where 1.0 would be a full prefill reading nothing
    fixed = replace(default, selector="deviation", auto_budget=False, check_layers=(0,), ratios=(0.99999,))
    tok = engine.tokenizer

    def answer(pre) -> str:
        return engine.generate_from(pre, max_new_tokens=args.answer_tokens, stop=STOP).text.strip()

    questions, cases = [], []
    for i, q in enumerate(qs):
        req = dict(chunks=q.passages, query=ask(tok, q.question), prefix=PREFIX)
        request = engine.request(**req)
        full = answer(engine.prefill(**req, recompute_ratio=1.0))
        blend = engine.prefill(**req)  # the product's path: the model's default config, its head cache
        text = answer(blend)
        row = {"index": args.start + i, "target": q.target, "passages": len(q.passages), "full": full, "default": text,
               "full_right": bool(_right(full, q.answers)), "default_right": bool(_right(text, q.answers)),
               "default_share": blend.stats.recomputed_tokens / blend.stats.prompt_tokens}
        questions.append(row)
        if not every and not (row["full_right"] and not row["default_right"]):
            continue
        tried = []
        for label, positions in ablations(passage_rows(request), q.target).items():
            pre = Prefiller(engine.adapter, engine.kv.encode, engine.kv.records, fixed, Fixed(positions)).run(request)
            out = answer(pre)
            tried.append({"label": label, "share": pre.stats.recomputed_tokens / pre.stats.prompt_tokens,
                          "right": bool(_right(out, q.answers)), "same_as_full": out == full, "answer": out})
        cases.append(dict(row, question=q.question, ablations=tried))
        fixes = [a["label"] for a in tried if a["right"]]
        print(f"#{args.start + i} target {q.target}: full {full!r}, default {text!r}; repaired by {fixes}", flush=True)
    kept = sum(r["full_right"] and r["default_right"] for r in questions)
    right = sum(r["full_right"] for r in questions)
    summary = summarize(cases)
    last = args.start + len(qs) - 1
    print(f"\n{args.model}, facts {args.split} {args.start}-{last}: the default keeps {kept} of the "
          f"{right} answers full prefill gets right; {len(cases)} ablated\n")
    print("| recomputed from layer 0 | lost answers repaired | tries that repair | mean share of the prompt |")
    print("|---|---|---|---|")
    for kind, s in summary.items():
        tries, share = s["share_of_tries_repairing"], s["mean_share"]
        print(f"| {kind} | {s['repaired']} of {s['lost']} | {tries:.0%} | {share:.1%} |")
    meta = {"dataset": "facts", "split": args.split, "start": args.start, "count": len(qs), "kept": kept,
            "full_right": right, "default": repr(default)}
    record.write(args.run_file, {"meta": meta, "summary": summary, "questions": questions, "cases": cases})


if __name__ == "__main__":
    sys.exit(main())
