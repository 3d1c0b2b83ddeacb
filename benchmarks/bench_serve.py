"""Serving benchmark: client-side TTFT and aggregate output tokens/s at several concurrencies,
blending on vs ``recompute_ratio=1.0`` (full prefill), against one ``cacheblend serve`` process.

    .venv/bin/python benchmarks/bench_serve.py --out bench_serve_out
    .venv/bin/python benchmarks/bench_serve.py --concurrency 1,4,8 --requests 8 --chunks 4 --chunk-tokens 256
    .venv/bin/python benchmarks/bench_serve.py --quick    # levels 1,2, 2 requests of 2 short chunks, 4 tokens

The server runs as a subprocess (its own interpreter: no GIL shared with the clients) on a free
loopback port it binds itself (its output in OUT/serve.log) with a memory-only store; the pydoc passages are warmed through ``/v1/documents``
first, as an indexing job would. Every request streams; TTFT is from sending the request to the
first chunk that carries text. Throughput is the sum of completion tokens over the wall time of
the whole level (``requests`` requests, at most ``concurrency`` in flight), prefills included.
The decode rate is read from the server's ``/metrics`` (sequence steps / seconds in batched
decode forwards during the level): what batching alone buys. Both modes run level by level,
back to back, on the same server; each level runs ``--repeats`` times with the modes alternating,
and the table gives the median of each figure over the repeats (a slow spell of a shared machine
then hits both modes, not one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import httpx
from runfile import RunRecord, add_common

from cacheblend.tools.serve_process import ServeProcess

MODES = {"blend": None, "full prefill": 1.0}


def start_server(args) -> ServeProcess:
    """The server on a port it binds itself, its output in OUT/serve.log; returns it once healthy."""
    cmd = ["--model", args.model, "--store", "none", "--max-batch", str(max(args.levels)), "--max-queue", "256"]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    server = ServeProcess(cmd, Path(args.out) / "serve.log").start()
    try:
        server.wait_ready(timeout=300)
    except BaseException:
        server.stop()
        raise
    return server


def workload(args):
    from cacheblend import shared_engine
    from cacheblend.tools.datasets import pydoc_passages, pydoc_workload

    count = shared_engine(args.model, device="cpu").count_tokens  # the model's own tokenizer (weights loaded here too)
    passages = [p for p in pydoc_passages(count, args.chunk_tokens) if count(p.text) >= args.chunk_tokens * 3 // 4]
    examples = pydoc_workload(passages, args.requests * len(args.levels), args.chunks, seed=args.seed)
    return examples, count


async def one_request(client: httpx.AsyncClient, url: str, model: str, ex, ratio, max_tokens: int) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "\n\n".join(ex.passages) + "\n\n" + ex.question}],
        "max_tokens": max_tokens, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
    }
    if ratio is not None:
        body["recompute_ratio"] = ratio
    sent, ttft, usage = time.perf_counter(), None, None
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if ttft is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - sent
    return {"ttft": ttft if ttft is not None else time.perf_counter() - sent, "usage": usage}


def decode_counters(url: str) -> tuple[float, float]:
    """(decode rows, decode seconds) from the server's /metrics."""
    values = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(("cacheblend_decode_rows_total ", "cacheblend_decode_seconds_total ")):
            name, value = line.split()
            values[name] = float(value)
    return values["cacheblend_decode_rows_total"], values["cacheblend_decode_seconds_total"]


async def level(url, model, examples, ratio, concurrency, max_tokens) -> dict:
    rows0, seconds0 = decode_counters(url)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=None) as client:
        async def run(ex):
            async with gate:
                return await one_request(client, url, model, ex, ratio, max_tokens)

        started = time.perf_counter()
        results = await asyncio.gather(*(run(ex) for ex in examples))
        wall = time.perf_counter() - started
    rows1, seconds1 = decode_counters(url)
    ttfts = sorted(r["ttft"] for r in results)
    tokens = sum(r["usage"]["completion_tokens"] for r in results)
    cached = sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in results)
    prompt = sum(r["usage"]["prompt_tokens"] for r in results)
    return {
        "concurrency": concurrency, "requests": len(results), "ttft_p50": statistics.median(ttfts),
        "ttft_p95": ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))], "tokens": tokens,
        "wall_s": wall, "tokens_per_s": tokens / wall, "cached_share": cached / prompt,
        # the batched decode steps' rate; None where no step ran (every token picked at admission:
        # the first, and a draft selector's draft verified in one forward, generation/lockstep.py)
        "decode_tokens_per_s": (rows1 - rows0) / (seconds1 - seconds0) if seconds1 > seconds0 else None,
        "ttfts": ttfts,
    }


def run(args, examples) -> list[dict]:
    server = start_server(args)
    url = server.url
    try:
        texts = sorted({p for ex in examples for p in ex.passages})
        t = time.perf_counter()
        httpx.post(url + "/v1/documents", json={"documents": texts}, timeout=None).raise_for_status()
        print(f"warmed {len(texts)} passages in {time.perf_counter() - t:.1f}s", flush=True)
        asyncio.run(level(url, args.model, examples[:1], None, 1, 4))  # first-request costs out of the way
        rows = []
        for i, c in enumerate(args.levels):
            batch = examples[i * args.requests : (i + 1) * args.requests]
            runs = {mode: [] for mode in MODES}
            for r in range(args.repeats):  # modes alternate, so a slow spell of the machine hits both
                for mode, ratio in MODES.items():
                    row = {"mode": mode, "repeat": r} | asyncio.run(level(url, args.model, batch, ratio, c, args.max_tokens))
                    print(json.dumps(row), flush=True)
                    runs[mode].append(row)
            rows += [median_row(mode, runs[mode]) for mode in MODES]
        return rows
    finally:
        server.stop()


def median_row(mode: str, runs: list[dict]) -> dict:
    """One level's figures: the median over repeats of each figure (every TTFT kept in ``ttfts``)."""
    row = {"mode": mode, "concurrency": runs[0]["concurrency"], "requests": sum(r["requests"] for r in runs)}
    for key in ("ttft_p50", "ttft_p95", "tokens_per_s", "decode_tokens_per_s", "cached_share"):
        row[key] = statistics.median(r[key] for r in runs)
    row["repeats"] = [{k: r[k] for k in ("ttft_p50", "ttft_p95", "tokens_per_s")} for r in runs]
    row["ttfts"] = [t for r in runs for t in r["ttfts"]]
    return row


def report(rows: list[dict], args, out: Path, prompt_tokens: int) -> str:
    out.mkdir(parents=True, exist_ok=True)
    by = {(r["mode"], r["concurrency"]): r for r in rows}
    lines = [
        f"pydoc workload: {args.requests} requests per level (median over {args.repeats} runs, modes alternating), {args.chunks} chunks of ~{args.chunk_tokens} tokens "
        f"(~{prompt_tokens} prompt tokens), {args.max_tokens} max output tokens, {args.model}",
        "",
        "| concurrency | mode | TTFT p50 (s) | TTFT p95 (s) | output tok/s | decode tok/s | prompt tokens from cache |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['concurrency']} | {r['mode']} | {r['ttft_p50']:.2f} | {r['ttft_p95']:.2f} | "
                     f"{r['tokens_per_s']:.1f} | {r['decode_tokens_per_s']:.1f} | {r['cached_share']:.0%} |")
    lo, hi = min(args.levels), max(args.levels)
    lines.append("")
    for mode in MODES:
        gain = by[(mode, hi)]["tokens_per_s"] / by[(mode, lo)]["tokens_per_s"]
        decode = by[(mode, hi)]["decode_tokens_per_s"] / by[(mode, lo)]["decode_tokens_per_s"]
        lines.append(f"- {mode}: at concurrency {hi}, output tokens/s {gain:.2f}x and decode tokens/s {decode:.2f}x "
                     f"those at {lo}")
    for c in args.levels:
        speed = by[("full prefill", c)]["ttft_p50"] / by[("blend", c)]["ttft_p50"]
        lines.append(f"- concurrency {c}: TTFT p50 {speed:.2f}x lower with blending")
    text = "\n".join(lines) + "\n"
    (out / "bench_serve.md").write_text(text)
    (out / "bench_serve.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2, default=str))
    plot(rows, args.levels, out / "bench_serve.png")
    return text


def plot(rows: list[dict], levels: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for mode, style, color in zip(MODES, ("o-", "s--"), ("tab:blue", "tab:orange")):
        mine = [r for r in rows if r["mode"] == mode]
        left.plot(levels, [r["ttft_p50"] for r in mine], style, color=color, label=f"{mode} p50")
        left.plot(levels, [r["ttft_p95"] for r in mine], style, color=color, alpha=0.35, label=f"{mode} p95")
        right.plot(levels, [r["tokens_per_s"] for r in mine], style, color=color, label=f"{mode}: output")
        right.plot(levels, [r["decode_tokens_per_s"] for r in mine], style, color=color, alpha=0.35,
                   label=f"{mode}: decode only")
    left.set(xlabel="concurrent clients", ylabel="TTFT at the client (s)", xticks=levels, title="time to first token")
    right.set(xlabel="concurrent clients", ylabel="tokens / s (all clients)", xticks=levels,
              title="aggregate throughput")
    left.legend()
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p, quick="concurrency 1,2, 2 requests per level of 2 chunks of up to 64 tokens, 4 output tokens, 1 repeat")
    p.add_argument("--concurrency", default="1,4,8")
    p.add_argument("--requests", type=int, default=8, help="requests per concurrency level and mode")
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--chunk-tokens", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=None, help="torch threads of the server")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3,
                   help="runs of each level and mode, alternating modes; the table shows medians over them")
    p.add_argument("--out", default="bench_serve_out")
    args = p.parse_args(argv)
    if args.quick:
        args.concurrency, args.requests, args.chunks, args.chunk_tokens = "1,2", 2, 2, 64
        args.max_tokens, args.repeats = 4, 1
    args.levels = [int(x) for x in args.concurrency.split(",")]
    record = RunRecord.start(args)
    examples, count = workload(args)
    prompt_tokens = round(statistics.mean(sum(count(t) for t in ex.passages) for ex in examples))
    started = time.perf_counter()
    rows = run(args, examples)
    print("\n" + report(rows, args, Path(args.out), prompt_tokens))
    print(f"{time.perf_counter() - started:.0f}s; wrote {args.out}/bench_serve.md, .json, .png")
    record.write(args.run_file, {"args": vars(args), "prompt_tokens": prompt_tokens, "rows": rows})


if __name__ == "__main__":
    main()
