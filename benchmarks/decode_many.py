"""Decoding several answers together (``BlendEngine.generate_many``) against one after another.

    .venv/bin/python benchmarks/decode_many.py --prompts 8 --answer-tokens 32 --repeats 3
    .venv/bin/python benchmarks/decode_many.py --quick     # 2 prompts, 4 tokens, 1 repeat

Prefills ``--prompts`` development fact questions (six passages each, full prefill: the decode is
what is timed), then, interleaved per repeat, decodes every answer with ``generate_from`` one
after another and with ``generate_many`` (all at once, up to ``--max-batch``), greedy. On a CPU a
decode step of one row reads every weight; answers stepped together share that read. Prints the
decode time of each way, tokens per second and their ratio (medians over repeats), and how many
answers came out the same token for token (greedy: all, fp32 round-off aside).
"""

from __future__ import annotations

import argparse
import statistics
import time

from runfile import RunRecord, add_common


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, quick="2 prompts, 4 answer tokens, 1 repeat")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--answer-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-batch", type=int, default=16)
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.answer_tokens, args.repeats = 2, 4, 1
    record = RunRecord.start(args)

    from cacheblend import BlendEngine
    from cacheblend.tools.factset import questions

    engine = BlendEngine.from_pretrained(args.model)
    pres = [engine.prefill(chunks=q.passages, query=q.question, prefix="Answer briefly from the passages.",
                           recompute_ratio=1.0) for q in questions("dev", args.prompts)]
    times: dict[str, list[float]] = {"one after another": [], "together": []}
    for _ in range(args.repeats):
        t = time.perf_counter()
        alone = [engine.generate_from(p, max_new_tokens=args.answer_tokens) for p in pres]
        times["one after another"].append(time.perf_counter() - t)
        t = time.perf_counter()
        together = engine.generate_many(pres, max_new_tokens=args.answer_tokens, max_batch=args.max_batch)
        times["together"].append(time.perf_counter() - t)
    tokens = sum(len(g.token_ids) for g in alone)
    same = sum(a.token_ids == b.token_ids for a, b in zip(alone, together))
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["one after another"] / med["together"]
    for name, s in med.items():
        print(f"{name}: {s:.2f} s for {tokens} tokens ({tokens / s:.1f} tokens/s)")
    print(f"together {ratio:.2f}x faster; {same} of {len(pres)} answers the same token for token")
    record.write(args.run_file, {
        "prompts": len(pres), "prompt_tokens": [len(p.ids) for p in pres], "answer_tokens": args.answer_tokens,
        "max_batch": args.max_batch, "repeats": args.repeats, "tokens": tokens, "seconds": times,
        "median_s": med, "tokens_per_s": {k: tokens / s for k, s in med.items()}, "speedup": ratio,
        "same_answers": same,
    })


if __name__ == "__main__":
    main()
