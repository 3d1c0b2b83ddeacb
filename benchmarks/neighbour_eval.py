"""Neighbour-aware warming, measured (issue 10): does a chunk's KV computed behind similar passages
blend closer to full prefill than its KV computed alone?

    python benchmarks/neighbour_eval.py --split dev --count 15
    python benchmarks/neighbour_eval.py --quick     # 1 question, alone and behind 1 similar passage

On the generated fact set (cacheblend.tools.factset), for each question the six passages are
warmed under one of these contexts (always after the chat template's system header, the default
chunk context), then blended (deviation selector at 15%, and full reuse):

- ``alone``: the default, each passage on its own;
- ``co-retrieved K``: behind K other passages of the same prompt (an oracle of what a vector
  index's nearest neighbours would give when chunks are retrieved together);
- ``similar K``: behind K passages of other entities that never appear in the prompt (same
  sentence pattern: what "nearest neighbours" means on this set);
- ``unrelated K``: behind K fixed pydoc passages (a primer that is not similar).

Reported: mean KL(full prefill || blend) over the full-prefill answer's tokens, and top-1
agreement along it. Research code: it writes records into the engine's memory tier directly.
"""

from __future__ import annotations

import argparse
import random
import statistics

import torch
from runfile import RunRecord, add_common
from select_eval import PREFIX, STOP, _compare

from cacheblend import BlendConfig, shared_engine
from cacheblend.blending.warm_forward import forward_padded
from cacheblend.stores import ChunkRecord, MemoryStore
from cacheblend.tools.datasets import pydoc_passages
from cacheblend.tools.factset import questions

CONFIGS = {"deviation 15%": BlendConfig(), "full reuse": BlendConfig(ratios=(0.0,))}


def contexts(mode: str, k: int, q, j: int, pool: list[str], primers: list[str]) -> list[str]:
    """The passages chunk ``j`` of question ``q`` is warmed behind."""
    if mode == "co-retrieved":
        return [q.passages[(j + d) % len(q.passages)] for d in range(1, k + 1)]
    if mode == "similar":
        return random.Random(f"{q.question}:{j}").sample([p for p in pool if p not in q.passages], k)
    if mode == "unrelated":
        return primers[:k]
    return []


def warm_behind(engine, q, mode: str, k: int, pool: list[str], primers: list[str]) -> None:
    engine.kv.stores.memory = MemoryStore()
    for j, text in enumerate(q.passages):
        ctx = list(engine.kv.context_ids)
        for other in contexts(mode, k, q, j, pool, primers):
            ctx += engine.kv.encode(other).ids
        ids = engine.kv.encode(text).ids
        (key,) = engine.kv.keys([text])
        kv = forward_padded(engine.adapter, ctx, [ids])[0][..., : len(ids), :]  # [layers, 2, Hkv, T, d]
        engine.kv.stores.memory.put(ChunkRecord(key, kv.to("cpu", torch.float16).contiguous(), text))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, quick="1 development question, warmed alone and behind 1 similar passage")
    ap.add_argument("--split", default="dev", choices=("dev", "report"))
    ap.add_argument("--count", type=int, default=15)
    ap.add_argument("--modes", default="alone:0,co-retrieved:2,co-retrieved:5,similar:2,unrelated:1,unrelated:2")
    args = ap.parse_args(argv)
    if args.quick:
        args.split, args.count, args.modes = "dev", 1, "alone:0,similar:1"
    record = RunRecord.start(args)
    torch.set_num_threads(1)
    engine = shared_engine(args.model)
    qs = questions(args.split, args.count)
    pool = sorted({p for q in questions(args.split, 200) for p in q.passages})
    primers = [p.text for p in pydoc_passages(engine.count_tokens, 160)][100:300:100]
    modes = [(m, int(k)) for m, k in (x.split(":") for x in args.modes.split(","))]
    res: dict[tuple, list] = {}
    for q in qs:
        req = dict(chunks=q.passages, query=q.question, prefix=PREFIX)
        full = engine.prefill(**req, recompute_ratio=1.0)
        ref = engine.generate_from(full, max_new_tokens=20, stop=STOP)
        p = torch.log_softmax(full.continuation_logits(ref.token_ids), dim=-1)  # [T+1, vocab]
        for mode, k in modes:
            warm_behind(engine, q, mode, k, pool, primers)
            for name, cfg in CONFIGS.items():
                pre = engine.prefill(**req, config=cfg.with_kv_of(engine.config))
                kl, top1, _, _ = _compare(p, pre, ref.token_ids, False, engine.eos_ids)
                res.setdefault((name, mode, k), []).append((kl, top1))
    print("| blend | warmed behind | mean KL | top-1 agreement |\n|---|---|---|---|")
    rows = []
    for (name, mode, k), v in res.items():
        label = mode if mode == "alone" else f"{mode} {k}"
        rows.append({"blend": name, "warmed_behind": label, "kl": statistics.mean(x[0] for x in v),
                     "top1": statistics.mean(x[1] for x in v)})
        print(f"| {name} | {label} | {rows[-1]['kl']:.4f} | {rows[-1]['top1']:.3f} |")
    print(f"\nfacts, {args.split} split, {len(qs)} questions")
    record.write(args.run_file, {"split": args.split, "questions": len(qs), "rows": rows})


if __name__ == "__main__":
    main()
