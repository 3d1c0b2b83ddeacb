"""Warming tokens/s against full-prefill tokens/s on the same tokens, interleaved in one process.

    .venv/bin/python benchmarks/warm_rate.py --chunks 12 --repeats 3
    .venv/bin/python benchmarks/warm_rate.py --quick     # 2 passages of up to 96 tokens, 1 repeat

Takes ``--chunks`` pydoc passages (~384-512 tokens each: ``--chunk-tokens``) and times, alternately:
- warming: ``forward_padded`` in batches of 8, what ``engine.warm`` runs (explicit-mask path);
- equal-length: ``forward_grouped`` (equal-length sub-batches, causal kernel), the alternative;
- full prefill: one prefill over the same tokens concatenated in groups of 6 (~3,000 tokens,
  the size of a benchmark prompt).
- ``engine.warm`` alone, behind 1 neighbour, and behind 1 neighbour with lead records (the
  default: each chunk's KV warmed alone is kept too): the whole warming path.
Prints the median rate of each in chunk tokens/s, and in tokens computed per second (for
``engine.warm``: each chunk's context and neighbour included; for the others, chunk tokens).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cacheblend import BlendConfig, BlendEngine
from cacheblend.blending.blend import BlendInput, blend_prefill
from cacheblend.blending.warm_forward import forward_padded, forward_grouped
from cacheblend.blending.selection import NoneSelector
from cacheblend.tools.datasets import pydoc_passages
from runfile import RunRecord, add_common


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, quick="2 pydoc passages of up to 96 tokens, 1 repeat")
    ap.add_argument("--chunks", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunk-tokens", type=int, default=512, help="pydoc passages of at most this, at least 3/4 of it")
    args = ap.parse_args(argv)
    if args.quick:
        args.chunks, args.repeats, args.chunk_tokens = 2, 1, 96
    record = RunRecord.start(args)
    engine = BlendEngine.from_pretrained(args.model)
    model, ctx = engine.adapter, engine.kv.context_ids
    lo = args.chunk_tokens * 3 // 4
    passages = [p for p in pydoc_passages(engine.count_tokens, args.chunk_tokens) if engine.count_tokens(p.text) >= lo]
    chunks = [engine.kv.encode(p.text).ids for p in passages[: args.chunks]]
    tokens = sum(map(len, chunks))

    order = sorted(chunks, key=len)  # as warming orders them

    def padded():
        for i in range(0, len(order), 8):
            forward_padded(model, ctx, order[i : i + 8])

    def warming():
        for i in range(0, len(order), 8):
            forward_grouped(model, ctx, order[i : i + 8])

    def full():
        for i in range(0, len(chunks), 6):
            ids = torch.tensor([t for c in chunks[i : i + 6] for t in c], device=model.device)
            inp = BlendInput(ids, torch.zeros_like(ids, dtype=torch.bool), None, torch.zeros_like(ids))
            blend_prefill(model, inp, NoneSelector(), {})

    texts = [p.text for p in passages[: args.chunks]]
    computed: dict[str, int] = {}

    def warm_with(name: str, config: BlendConfig):
        # fresh memory-only engines, built before timing (building one digests the weights)
        fresh = [BlendEngine(model.model, engine.tokenizer, config=config) for _ in range(args.repeats)]

        def run():  # the whole engine.warm path
            eng = fresh.pop()
            eng.warm(texts, progress=False)
            computed[name] = eng.kv.tokens_warmed
        return name, run

    runs = {"warming (forward_padded)": padded, "equal-length (forward_grouped)": warming, "full prefill": full}
    runs.update([
        warm_with("engine.warm, alone", BlendConfig(neighbours=0)),
        warm_with("engine.warm, 1 neighbour, no lead records", BlendConfig(neighbours=1, lead_alone=False)),
        warm_with("engine.warm, 1 neighbour + lead records (the default)", BlendConfig()),
    ])
    rates: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            t = time.perf_counter()
            fn()
            rates[name].append((computed.get(name, tokens), time.perf_counter() - t))
    print(f"{len(chunks)} chunks, {tokens} tokens, {args.repeats} interleaved repeats (median tokens/s):")
    out = {}
    for name, r in rates.items():
        chunk_rate = statistics.median(tokens / t for _, t in r)
        done = statistics.median(n / t for n, t in r)
        out[name] = {"chunk_tokens_per_s": chunk_rate, "computed_tokens_per_s": done, "runs": r}
        print(f"  {name:30s} {chunk_rate:7.0f} chunk tokens/s {done:7.0f} computed tokens/s (context included)")
    record.write(args.run_file, {"chunks": len(chunks), "tokens": tokens, "repeats": args.repeats, "rates": out})


if __name__ == "__main__":
    main()
