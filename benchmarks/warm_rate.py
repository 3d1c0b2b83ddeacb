"""Warming tokens/s against full-prefill tokens/s on the same tokens, interleaved in one process.

    .venv/bin/python benchmarks/warm_rate.py --chunks 12 --repeats 3

Takes ``--chunks`` pydoc passages (~384-512 tokens each) and times, alternately:
- warming: ``encode_padded`` in batches of 8, what ``engine.warm`` runs (explicit-mask path);
- equal-length: ``encode_grouped`` (equal-length sub-batches, causal kernel), the alternative;
- full prefill: one prefill over the same tokens concatenated in groups of 6 (~3,000 tokens,
  the size of a benchmark prompt).
Prints the median tokens/s of each (chunk tokens only, the shared context excluded).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cacheblend import BlendEngine
from cacheblend.blending.blend import BlendInput, blend_prefill
from cacheblend.blending.encode import encode_padded, encode_grouped
from cacheblend.blending.selection import NoneSelector
from cacheblend.tools.datasets import pydoc_passages


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    engine = BlendEngine.from_pretrained()
    model, ctx = engine.adapter, engine.context_ids
    passages = [p for p in pydoc_passages(engine.count_tokens) if engine.count_tokens(p.text) >= 384]
    chunks = [engine.encode_chunk(p.text).ids for p in passages[: args.chunks]]
    tokens = sum(map(len, chunks))

    order = sorted(chunks, key=len)  # as warming orders them

    def padded():
        for i in range(0, len(order), 8):
            encode_padded(model, ctx, order[i : i + 8])

    def warming():
        for i in range(0, len(order), 8):
            encode_grouped(model, ctx, order[i : i + 8])

    def full():
        for i in range(0, len(chunks), 6):
            ids = torch.tensor([t for c in chunks[i : i + 6] for t in c], device=model.device)
            inp = BlendInput(ids, torch.zeros_like(ids, dtype=torch.bool), None, torch.zeros_like(ids))
            blend_prefill(model, inp, NoneSelector(), {})

    runs = {"warming (encode_padded)": padded, "equal-length (encode_grouped)": warming, "full prefill": full}
    rates: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            t = time.perf_counter()
            fn()
            rates[name].append(tokens / (time.perf_counter() - t))
    print(f"{len(chunks)} chunks, {tokens} tokens, {args.repeats} interleaved repeats (median tokens/s):")
    for name, r in rates.items():
        print(f"  {name:26s} {statistics.median(r):7.0f} tokens/s")


if __name__ == "__main__":
    main()
