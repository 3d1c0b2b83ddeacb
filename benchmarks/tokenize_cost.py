"""What tokenizing a request's chunks costs, before and after ``ChunkKV.encode`` remembers them.

    .venv/bin/python benchmarks/tokenize_cost.py --prompts 8 --repeats 5
    .venv/bin/python benchmarks/tokenize_cost.py --quick     # 2 prompts of 2 short passages

Each blended prefill tokenizes every chunk span of its prompt on its own (``assemble.chunk_encodings``:
the ids a chunk was warmed with, to look its records up). For ``--prompts`` pydoc prompts of 6
passages (~512 tokens each) it times, interleaved, the chunks' tokenization with the tokenizer
each time (``encode_chunk``, as before the cache) and through the engine's cache (``ChunkKV.encode``,
a chunk retrieved again), and for scale one full prefill of the same request (TTFT). Prints the
medians in ms.
"""

from __future__ import annotations

import argparse
import statistics
import time

from cacheblend import BlendEngine
from cacheblend.prompts.assemble import chunk_encodings
from cacheblend.prompts.tokenize import encode_chunk
from cacheblend.tools.datasets import pydoc_passages, pydoc_workload
from runfile import RunRecord, add_common


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, quick="2 prompts of 2 passages of up to 96 tokens, 1 repeat")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    per_prompt, max_tokens = (2, 96) if args.quick else (6, 512)
    if args.quick:
        args.prompts, args.repeats = 2, 1
    record = RunRecord.start(args)
    engine = BlendEngine.from_pretrained(args.model)
    passages = pydoc_passages(engine.count_tokens, max_tokens)
    workload = pydoc_workload(passages, args.prompts, per_prompt)
    uncached = lambda text: encode_chunk(engine.tokenizer, text)  # noqa: E731: the tokenizer each time
    rows = []
    for ex in workload:
        request = engine.request(chunks=ex.passages, query=ex.question)
        chunk_encodings(request.text, engine.kv.encode)  # the first sight of each chunk fills the cache
        times = {"tokenizer": [], "cached": [], "full_prefill": []}
        for _ in range(args.repeats):
            for name, encode in (("tokenizer", uncached), ("cached", engine.kv.encode)):
                t = time.perf_counter()
                chunk_encodings(request.text, encode)
                times[name].append(time.perf_counter() - t)
            times["full_prefill"].append(engine.prefill(request, recompute_ratio=1.0).stats.ttft_s)
        rows.append({"prompt_tokens": len(request.ids), "ms": {k: statistics.median(v) * 1e3 for k, v in times.items()}})
    med = {k: statistics.median(r["ms"][k] for r in rows) for k in times}
    tokens = statistics.median(r["prompt_tokens"] for r in rows)
    print(f"{len(rows)} prompts of {per_prompt} passages, median {tokens:.0f} tokens: chunks tokenized "
          f"{med['tokenizer']:.2f} ms, through the cache {med['cached']:.2f} ms; full prefill {med['full_prefill']:.0f} ms")
    record.write(args.run_file, {"prompts": len(rows), "passages_per_prompt": per_prompt, "repeats": args.repeats,
                                 "median_prompt_tokens": tokens, "median_ms": med, "prompts_ms": rows})


if __name__ == "__main__":
    main()
