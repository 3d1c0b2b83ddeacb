"""A Zipf retrieval trace over a bounded KV store: hit rate, cached share and TTFT over time.

Passages: the pydoc corpus plus every passage of the MuSiQue set's questions (``--dataset``),
pooled. Queries: ``--queries`` prompts of 6 distinct passages each, drawn Zipf-skewed (exponent
``--zipf``, 1.1) over a shuffled ranking of the pool. The store: the engine's memory tier
(``cacheblend.stores.MemoryStore``: aged-frequency eviction with TinyLFU admission,
``stores/policy.py``) bounded to ``--budget`` (10%) of the pool's KV bytes (each passage's real
token count times the model's KV bytes per token).

Two legs.

1. **The store leg** replays the whole trace through the real tier (no model compute: each
   record is a placeholder tensor of its passage's size, which is all the policy sees) under:
   ``optimum`` (the trace's most frequent passages that fit, stored from the start: the best a
   static store of that size can do), ``index`` (index-time warming of the corpus's first
   passages that fit, no warm on miss), ``miss`` (nothing warmed at index time, warm on miss:
   a missed passage is stored after its query), ``index+miss``, and ``miss-lru`` (warm on miss
   into a plain LRU tier of the same size: what the policy buys). Per window of queries: chunk
   hit rate and cached share (tokens of hits over tokens of passages).
2. **The model leg** (``--sample`` prompts of the trace's second half, the real model): each
   prompt prefilled with exactly the passages that hit in the ``miss`` replay cached, then with
   those of ``optimum``, then with none (every passage computed, the blend's cost when nothing
   is stored); TTFT p50 of each. Then warm on miss against its own control over the trace's
   first ``--p99-queries`` prompts, one after another with ``--think`` seconds between them: an
   engine warming misses in the background vs one without warm on miss (every chunk stays a
   miss) and vs one warming the same misses synchronously between the timed prompts (the
   background's store state without its timing): TTFT p99 of each.

    python benchmarks/trace_bench.py --run-file docs/runs/trace_bench.json --plot docs/trace_bench.png

``--legs background`` runs only the p99 comparison (about 10 minutes, its own run file).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import OrderedDict
from pathlib import Path

from runfile import ROOT, RunRecord, add_common

MODES = ("optimum", "index", "miss", "index+miss", "miss-lru")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default=str(ROOT.parent / "shared" / "data" / "musique_s.json"),
                   help="a MuSiQue-format JSON whose passages join the pool (skipped if missing)")
    p.add_argument("--queries", type=int, default=4000)
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--budget", type=float, default=0.10, help="store size as a share of the pool's KV bytes")
    p.add_argument("--window", type=int, default=250, help="queries per point of the curves")
    p.add_argument("--sample", type=int, default=24, help="second-half prompts the model leg prefills")
    p.add_argument("--p99-queries", type=int, default=40)
    p.add_argument("--think", type=float, default=0.3, help="seconds between prompts in the p99 leg")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--legs", choices=("all", "background"), default="all", help="background: the p99 comparison only")
    p.add_argument("--plot", default=None, metavar="PNG")
    add_common(p, quick="the tiny model, 300 queries, 4 sampled prompts")
    args = p.parse_args()
    if args.quick:
        args.queries, args.window, args.sample, args.p99_queries, args.think = 300, 50, 4, 6, 0.05
    record = RunRecord.start(args)

    import numpy as np

    from cacheblend import BlendEngine, shared_engine

    engine = shared_engine(args.model)
    pool = corpus(engine, args.dataset, small=args.quick)
    sizes = [len(engine.kv.encode(t).ids) for t in pool]
    per_token = kv_bytes_per_token(engine)
    trace = zipf_trace(len(pool), args.queries, args.zipf, np.random.default_rng(args.seed))
    budget = max(1, int(args.budget * sum(sizes)))  # in tokens: records are sized in tokens below
    print(f"pool: {len(pool)} passages, {sum(sizes)} tokens, {sum(sizes) * per_token / 2**30:.2f} GiB of KV "
          f"({per_token} B/token); store: {args.budget:.0%} = {budget * per_token / 2**30:.2f} GiB; "
          f"{len(trace)} queries, Zipf {args.zipf}", flush=True)
    if args.legs == "background":
        result = {"pool": len(pool), "queries": args.p99_queries, "zipf": args.zipf,
                  "background": background_leg(engine, pool, trace, args, BlendEngine)}
        if args.run_file:
            record.write(args.run_file, result)
        return
    replays = {mode: replay(trace, sizes, budget, mode, args.window) for mode in MODES}
    half = len(trace) // 2
    summary = {m: {"hit_rate_2nd_half": r["hits"][half:].mean(), "cached_share_2nd_half": r["share"][half:].mean()}
               for m, r in replays.items()}
    best = summary["optimum"]["hit_rate_2nd_half"]
    for m, s in summary.items():
        s["of_optimum"] = s["hit_rate_2nd_half"] / best if best else None
        print(f"{m:>11}: 2nd-half hit rate {s['hit_rate_2nd_half']:.3f} ({s['of_optimum']:.2f} of optimum), "
              f"cached share {s['cached_share_2nd_half']:.3f}", flush=True)
    model_leg = ttft_leg(engine, pool, trace, replays, args)
    p99_leg = background_leg(engine, pool, trace, args, BlendEngine)
    result = {"pool": len(pool), "pool_tokens": sum(sizes), "kv_bytes_per_token": per_token, "budget": args.budget,
              "queries": len(trace), "zipf": args.zipf, "summary": summary, "ttft": model_leg, "background": p99_leg,
              "curves": {m: {"hit_rate": windows(r["hits"], args.window), "cached_share": windows(r["share"], args.window)}
                         for m, r in replays.items()}}
    if args.plot:
        plot(result, args.window, args.plot)
    if args.run_file:
        record.write(args.run_file, result)


def corpus(engine, dataset: str, small: bool = False) -> list[str]:
    """pydoc passages, then the MuSiQue passages (all of each question's), deduplicated."""
    import json

    from cacheblend.tools.datasets import pydoc_passages

    texts = [p.text for p in pydoc_passages(engine.count_tokens)]
    if Path(dataset).is_file():
        for ex in json.loads(Path(dataset).read_text(encoding="utf-8")):
            texts += [(c.get("title") + "\n" if c.get("title") else "") + c["text"] for c in ex["ctxs"]]
    texts = [t.strip() for t in dict.fromkeys(texts) if len(t.strip()) >= 32]
    return texts[:120] if small else texts


def kv_bytes_per_token(engine) -> int:
    """fp16 bytes of one token's KV over every layer (what a record stores per token)."""
    a = engine.adapter
    return a.num_layers * 2 * a.num_kv_heads * a.head_dim * 2


def zipf_trace(n: int, queries: int, s: float, rng) -> list[list[int]]:
    """``queries`` lists of 6 distinct passage indices, Zipf(``s``) over a shuffled ranking."""
    import numpy as np

    rank = rng.permutation(n)  # rank r -> passage
    p = 1.0 / np.arange(1, n + 1) ** s
    p /= p.sum()
    return [[int(rank[r]) for r in rng.choice(n, 6, replace=False, p=p)] for _ in range(queries)]


class LRUTier:
    """A plain least-recently-used tier of the same budget (the baseline the policy is measured by)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self.nbytes, self._records = max_bytes, 0, OrderedDict()

    def get_many(self, keys):
        out = [self._records.get(k) for k in keys]
        for k, r in zip(keys, out):
            if r is not None:
                self._records.move_to_end(k)
        return out

    def put(self, record) -> None:
        self._records[record.key] = record
        self.nbytes += record.nbytes
        while self.nbytes > self.max_bytes:
            self.nbytes -= self._records.popitem(last=False)[1].nbytes


def replay(trace, sizes, budget: int, mode: str, window: int) -> dict:
    """Per query: the share of its passages that hit and of its tokens that were cached."""
    import numpy as np
    import torch

    from cacheblend.stores import ChunkRecord, MemoryStore

    def rec(i: int) -> ChunkRecord:  # a placeholder of the passage's size: all a tier's policy sees
        return ChunkRecord(str(i), torch.empty(sizes[i], dtype=torch.uint8), "")

    tier = LRUTier(budget) if mode == "miss-lru" else MemoryStore(budget)
    if mode == "optimum":
        freq = np.bincount([i for q in trace for i in q], minlength=len(sizes))
        order = np.argsort(-freq, kind="stable")
    elif mode.startswith("index"):
        order = range(len(sizes))  # the corpus's first passages, as an index-time cap warms them
    else:
        order = []
    used = 0
    for i in order:
        if used + sizes[i] <= budget:
            tier.put(rec(int(i)))
            used += sizes[i]
    fixed = mode in ("optimum", "index")
    hits, share, held = np.zeros(len(trace)), np.zeros(len(trace)), []
    for n, q in enumerate(trace):
        got = tier.get_many([str(i) for i in q])
        held.append({i for i, r in zip(q, got) if r is not None})
        hits[n] = len(held[-1]) / len(q)
        share[n] = sum(sizes[i] for i, r in zip(q, got) if r is not None) / sum(sizes[i] for i in q)
        if not fixed:
            for i, r in zip(q, got):
                if r is None:
                    tier.put(rec(i))  # warm on miss: stored after the query that missed it
    return {"hits": hits, "share": share, "held": held}


def windows(values, window: int) -> list[float]:
    return [float(values[i : i + window].mean()) for i in range(0, len(values), window)]


def ttft_leg(engine, pool, trace, replays, args) -> dict:
    """TTFT p50 of sampled second-half prompts with the passages each replay says hit cached."""
    import numpy as np

    from cacheblend.prefilling import Prefiller

    rng = np.random.default_rng(args.seed + 1)
    half = len(trace) // 2
    picks = sorted(rng.choice(np.arange(half, len(trace)), min(args.sample, len(trace) - half), replace=False))
    states = {m: [replays[m]["held"][n] for n in picks] for m in ("miss", "optimum")}  # what each query hit
    needed = sorted({pool[i] for n in picks for i in trace[n]})
    engine.warm(needed, progress=False)
    out = {}
    for name in ("miss", "optimum", "none"):
        times = []
        for j, n in enumerate(picks):
            allowed = states[name][j] if name != "none" else set()
            keep = {tuple(engine.kv.encode(pool[i]).ids) for i in allowed}

            def records(chunks, keep=keep):  # the engine's records, for the passages this state holds
                got = engine.kv.records(chunks)
                return [r if tuple(c) in keep else None for c, r in zip(chunks, got)]

            req = engine.request(chunks=[pool[i] for i in trace[n]], query="What do these passages say?")
            times.append(Prefiller(engine.adapter, engine.kv.encode, records, engine.config).run(req).stats.ttft_s)
        out[name] = {"ttft_p50_s": statistics.median(times), "ttft_s": times}
        print(f"TTFT p50 with the {name} state's hits cached: {out[name]['ttft_p50_s']:.3f} s", flush=True)
    out["miss_vs_optimum_p50"] = out["miss"]["ttft_p50_s"] / out["optimum"]["ttft_p50_s"]
    return out


def background_leg(engine, pool, trace, args, BlendEngine) -> dict:
    """TTFT p99 of warm on miss in the background against no warm on miss at all ("off": every
    chunk stays a miss) and against a control that warms the same misses between the timed
    prompts (the background's store state without its timing)."""
    model, tok, cfg = engine.adapter.model, engine.tokenizer, engine.config
    # untimed: the process's first forwards are slow (allocator, thread pools), and with
    # ``--legs background`` the first leg's first prompt would be the process's first prefill
    engine.generate(chunks=[pool[i] for i in trace[0]], query="What do these passages say?", max_new_tokens=8)
    out = {}
    for name, eager, sync in (("background", True, False), ("off", False, False), ("control", False, True)):
        eng = BlendEngine(model, tok, config=cfg, warm_on_miss=eager)
        times = []
        try:
            for q in trace[: args.p99_queries]:
                out_ = eng.generate(chunks=[pool[i] for i in q], query="What do these passages say?", max_new_tokens=8)
                times.append(out_.stats.ttft_s)
                missed = [pool[i] for i in q if sync and not eng.kv.is_warm(pool[i])]
                if missed:
                    eng.warm(missed, progress=False)  # untimed: the control's store keeps pace
                time.sleep(args.think)
        finally:
            eng.close()
        times_sorted = sorted(times)
        out[name] = {"ttft_p50_s": statistics.median(times), "ttft_p99_s": times_sorted[min(len(times) - 1, int(0.99 * len(times)))],
                     "ttft_s": times, "warm_on_miss": eng.kv.misses.counts() if eager else None}
        print(f"{name}: TTFT p50 {out[name]['ttft_p50_s']:.3f} s, p99 {out[name]['ttft_p99_s']:.3f} s", flush=True)
    out["p99_ratio"] = out["background"]["ttft_p99_s"] / out["control"]["ttft_p99_s"]
    out["p99_ratio_vs_off"] = out["background"]["ttft_p99_s"] / out["off"]["ttft_p99_s"]
    return out


def plot(result: dict, window: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for mode, c in result["curves"].items():
        x = [window * (i + 0.5) for i in range(len(c["hit_rate"]))]
        axes[0].plot(x, c["hit_rate"], label=mode)
        axes[1].plot(x, c["cached_share"], label=mode)
    axes[0].set(xlabel="query", ylabel="chunk hit rate", title=f"store = {result['budget']:.0%} of the pool's KV")
    axes[1].set(xlabel="query", ylabel="cached share of passage tokens", title=f"Zipf {result['zipf']}, {result['pool']} passages")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
