"""What verifying a draft selector's draft in one forward saves the answer's decoding.

    .venv/bin/python benchmarks/draft_verify.py --prompts 20 --run-file docs/runs/draft_verify_musique.json
    .venv/bin/python benchmarks/draft_verify.py --dataset pydoc --prompts 8 --run-file docs/runs/draft_verify_pydoc.json
    .venv/bin/python benchmarks/draft_verify.py --quick     # 2 pydoc prompts of 2 short passages, the tiny model

A draft selector (SmolLM2's default, ``draft+gap``) decodes 8 greedy tokens over full reuse's
cache before its blend, and the blended answer then decodes its own tokens, a step (a read of every
weight) each. Where the blend changed little, those begin with the draft's; decoding takes them
from one forward over the draft instead (``Lockstep.verify_draft``, after the first token is out). For each prompt this
prefills once, then decodes that same prefill twice, alternating which goes first: as the product
does, and with its draft removed (the same prefill, ``BlendOutput.draft`` emptied: decoding as it
ran before). It reports whether the two answers are the same tokens (they should be, but for the
fp32 round-off of a batched product), how many tokens the verification picked, and the time each
decode took (from the prefill to the last token, one torch thread), the median of ``--repeats``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from cacheblend import BlendEngine
from cacheblend.config import BlendConfig
from cacheblend.tools.bench import QA_PREFIX
from cacheblend.tools.datasets import load_musique, pydoc_passages, pydoc_workload
from runfile import ROOT, RunRecord, add_common


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, quick="2 pydoc prompts of 2 passages of up to 96 tokens, selector 'draft', 1 repeat")
    ap.add_argument("--dataset", default=str(ROOT.parent / "shared" / "data" / "musique_s.json"),
                    help="a MuSiQue file, or 'pydoc' (6 passages of ~512 tokens per prompt)")
    ap.add_argument("--start", type=int, default=50, help="first MuSiQue example (50-149: the reporting split)")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--selector", default=None, help="the blend's selector (default: the model's)")
    args = ap.parse_args(argv)
    if args.quick:
        args.dataset, args.prompts, args.repeats, args.selector = "pydoc", 2, 1, args.selector or "draft"
    record = RunRecord.start(args)
    torch.set_num_threads(1)
    config = BlendConfig.for_model(args.model, selector=args.selector)
    engine = BlendEngine.from_pretrained(args.model, config=config)
    if args.dataset == "pydoc":
        size, per_prompt = (96, 2) if args.quick else (512, 6)
        examples = pydoc_workload(pydoc_passages(engine.count_tokens, size), args.prompts, per_prompt)
    else:
        examples = load_musique(Path(args.dataset), 6)[args.start:args.start + args.prompts]
    rows = []
    for i, ex in enumerate(examples):
        engine.warm(ex.passages, progress=False)
        pre = engine.prefill(chunks=ex.passages, query=ex.question, prefix=QA_PREFIX)
        plain = replace(pre, output=replace(pre.output, draft=[]))
        times, answers = {"verified": [], "plain": []}, {}
        for repeat in range(args.repeats):
            order = [("verified", pre), ("plain", plain)]
            for name, prefilled in order if repeat % 2 == 0 else order[::-1]:
                started = time.perf_counter()
                answers[name] = engine.generate_from(prefilled, max_new_tokens=args.max_new_tokens)
                times[name].append(time.perf_counter() - started)
        got, want = answers["verified"], answers["plain"]
        row = {"prompt_tokens": pre.stats.prompt_tokens, "drafted": len(pre.output.draft),
               "answer_tokens": len(want.token_ids), "same_tokens": got.token_ids == want.token_ids,
               "verified": got.stats.draft_verified, "prefill_s": pre.stats.ttft_s,
               "decode_s": {k: statistics.median(v) for k, v in times.items()}}
        row["decode_speedup"] = row["decode_s"]["plain"] / row["decode_s"]["verified"]
        rows.append(row)
        print(f"[{i + 1}/{len(examples)}] {row['prompt_tokens']} tokens: {row['verified']} of {row['answer_tokens']} "
              f"answer tokens verified at once, same tokens {row['same_tokens']}; decode {row['decode_s']['verified']:.2f}s "
              f"against {row['decode_s']['plain']:.2f}s", flush=True)
    total = [(r["prefill_s"] + r["decode_s"]["plain"]) / (r["prefill_s"] + r["decode_s"]["verified"]) for r in rows]
    summary = {"prompts": len(rows), "same_tokens": sum(r["same_tokens"] for r in rows),
               "mean_verified": statistics.mean(r["verified"] for r in rows),
               "mean_answer_tokens": statistics.mean(r["answer_tokens"] for r in rows),
               "median_decode_speedup": statistics.median(r["decode_speedup"] for r in rows),
               "median_total_speedup": statistics.median(total)}
    print(f"{summary['same_tokens']} of {len(rows)} answers the same tokens; {summary['mean_verified']:.2f} of "
          f"{summary['mean_answer_tokens']:.1f} answer tokens verified in one forward on average; decoding "
          f"{summary['median_decode_speedup']:.2f}x as fast (median per prompt), prefill and decoding "
          f"{summary['median_total_speedup']:.2f}x")
    record.write(args.run_file, {"config": repr(engine.config), "dataset": args.dataset, "start": args.start,
                                 "repeats": args.repeats, "max_new_tokens": args.max_new_tokens,
                                 "summary": summary, "prompts": rows})


if __name__ == "__main__":
    main()
