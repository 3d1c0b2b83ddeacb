"""What the head cache saves: the same blend with the prompt's head read (the default) and computed.

    python benchmarks/head_cache.py --model qwen2.5-0.5b-instruct --prompts 8 --repeats 3
    python benchmarks/head_cache.py --dataset ../shared/data/musique_s.json --start 50 --prompts 6
    python benchmarks/head_cache.py --system-words 300     # a long system message
    python benchmarks/head_cache.py --quick

The head is a prompt's tokens before its first chunk (chat template, system message, instructions):
nothing precedes them, so ``blending/head.py`` computes their K/V once and the blend reads them.
For each prompt of ``cacheblend bench``'s workload (pydoc, or MuSiQue with ``--dataset``; its QA
system message, or ``--system-words`` words of instructions), the engine's default config runs
``--repeats`` times interleaved with the head read (the cache warm: steady state) and with it
computed (``HeadCache.max_bytes = 0``: as before the cache). Per prompt: the median TTFT of each,
the rows each computed (summed over layers, both stages: ``BlendOutput.active_rows``), the head's
tokens, and the largest difference of the two prefills' last logits (the head read is exact up to
fp32 summation order). Prints the median over prompts of the TTFT ratio computed / read.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from cacheblend import BlendEngine
from cacheblend.tools.bench import QA_PREFIX
from cacheblend.tools.datasets import load_musique, pydoc_passages, pydoc_workload
from runfile import RunRecord, add_common

WORDS = ("Use only the passages below. Quote names, dates and numbers exactly as written. If the "
         "passages disagree, say so. If they do not hold the answer, say that you do not know. ").split()


def system_message(words: int) -> str:
    """The bench's QA message, or ``words`` words of instructions like a RAG application's."""
    return QA_PREFIX if words == 0 else " ".join(WORDS[i % len(WORDS)] for i in range(words))


def rows_computed(out) -> int:
    return sum(int(r.shape[0]) for r in (*out.first_stage_active, *out.active_rows))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, quick="2 pydoc prompts of 2 short passages, 1 repeat")
    ap.add_argument("--dataset", default=None, help="a MuSiQue-format JSON (default: the pydoc workload)")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--system-words", type=int, default=0, help="a system message of this many words (0: the bench's)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    per_prompt, min_tokens = (2, 64) if args.quick else (6, 384)
    if args.quick:
        args.prompts, args.repeats = 2, 1
    record = RunRecord.start(args)
    torch.set_num_threads(args.threads)
    engine = BlendEngine.from_pretrained(args.model)
    if args.dataset:
        examples = load_musique(args.dataset, per_prompt)[args.start : args.start + args.prompts]
    else:
        examples = pydoc_workload(pydoc_passages(engine.count_tokens, min_tokens=min_tokens), args.prompts, per_prompt)
    engine.warm(sorted({p for ex in examples for p in ex.passages}), progress=False)
    heads, prefix = engine.prefiller.heads, system_message(args.system_words)
    budget, rows = heads.max_bytes, []
    for ex in examples:
        request = engine.request(chunks=ex.passages, query=ex.question, prefix=prefix)
        runs = {"read": [], "computed": []}
        for _ in range(args.repeats + 1):  # the first round fills the cache and is not timed
            for name in runs:
                heads.max_bytes = budget if name == "read" else 0
                pre = engine.prefill(request)
                pre.cache()
                runs[name].append(pre)
        heads.max_bytes = budget
        read, computed = runs["read"][-1], runs["computed"][-1]
        ttft = {k: statistics.median(p.stats.ttft_s for p in v[1:]) for k, v in runs.items()}
        rows.append({
            "prompt_tokens": read.stats.prompt_tokens, "head_tokens": read.stats.head_tokens,
            "recomputed_tokens": {"read": read.stats.recomputed_tokens, "computed": computed.stats.recomputed_tokens},
            "rows": {"read": rows_computed(read.output), "computed": rows_computed(computed.output)},
            "first_stage": read.stats.first_stage_tokens > 0, "ttft_s": ttft, "ratio": ttft["computed"] / ttft["read"],
            "max_logit_diff": float((read.output.logits - computed.output.logits).abs().max())})
        r = rows[-1]
        print(f"{r['prompt_tokens']} tokens, head {r['head_tokens']}: rows {r['rows']['computed']} -> "
              f"{r['rows']['read']}, TTFT {ttft['computed']:.3f} -> {ttft['read']:.3f} s ({r['ratio']:.3f}x), "
              f"max logit diff {r['max_logit_diff']:.1e}")
    summary = {"median_ratio": statistics.median(r["ratio"] for r in rows),
               "median_rows_share": statistics.median(r["rows"]["read"] / r["rows"]["computed"] for r in rows),
               "median_head_tokens": statistics.median(r["head_tokens"] for r in rows),
               "max_logit_diff": max(r["max_logit_diff"] for r in rows)}
    print(f"{len(rows)} prompts: head {summary['median_head_tokens']:.0f} tokens, rows computed "
          f"x{summary['median_rows_share']:.3f}, TTFT computed / read {summary['median_ratio']:.3f}x (median), "
          f"max logit diff {summary['max_logit_diff']:.1e}")
    record.write(args.run_file, {"model": args.model, "config": repr(engine.config), "system_words": args.system_words,
                                 "prompts": rows, "summary": summary, "threads": args.threads,
                                 "repeats": args.repeats})


if __name__ == "__main__":
    main()
