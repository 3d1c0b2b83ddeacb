"""The ``cacheblend`` command's entry point and the demo, warm, ask and bench commands
(``cacheblend --help``; every command's arguments are in cliargs.py, serve's runner in
serving/command.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from .cliargs import DEMO_QUESTIONS, blend_config, demo_dir, parser
from .serving.command import cmd_serve

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"cacheblend: error: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    """cliargs.py's parser, each subcommand run by its function here (serve: serving/command.py)."""
    return parser({"demo": cmd_demo, "warm": cmd_warm, "ask": cmd_ask, "bench": cmd_bench, "serve": cmd_serve})


def _engine(args, store_dir, warm_on_miss: bool = False):
    from .engine import BlendEngine

    t = time.perf_counter()
    dtype = getattr(args, "dtype", None)
    config = blend_config(args)
    engine = BlendEngine.from_pretrained(args.model, device=args.device, dtype=dtype, store_dir=store_dir, config=config,
                                         warm_on_miss=warm_on_miss)
    print(f"model {engine.name} loaded in {time.perf_counter() - t:.1f}s ({engine.adapter.device})")
    return engine


def _build(engine, index_dir: Path, texts: list[str], limit: int | None = None) -> tuple["PassageIndex", dict]:  # noqa: F821
    """Adds ``texts`` to the index at ``index_dir`` and warms the KV of its first ``limit`` passages
    (None: all) into its store; returns the index and what it took (passages embedded, chunks
    computed, seconds of each)."""
    from .tools.demo_index import KV_DIR

    index, added, index_s = _index(index_dir, texts, limit)
    disk = engine.attach_store(index_dir / KV_DIR)
    warmed = index.texts[:limit]
    todo = sum(key not in disk for key in engine.kv.keys(warmed))
    t = time.perf_counter()
    engine.warm(warmed, store_dir=index_dir / KV_DIR, progress=todo > 0)
    warm_s = time.perf_counter() - t
    later = len(index.texts) - len(warmed)
    print(f"KV store {index_dir / KV_DIR}: {todo} chunks computed, {len(warmed) - todo} already stored "
          f"({warm_s:.1f}s)" + (f"; {later} left to warm on miss" if later else ""))
    return index, {"passages": len(index.texts), "embedded": added, "index_s": index_s, "computed": todo,
                   "warm_s": warm_s, "warm_limit": limit}


def _index(index_dir: Path, texts: list[str], limit: int | None):
    """Adds ``texts`` to the index at ``index_dir`` (embedding the new ones); returns the index,
    the passages added and the seconds it took."""
    from .tools.demo_index import PassageIndex, default_embedder

    if limit is not None and limit < 0:
        raise ValueError(f"--warm-limit must be >= 0, got {limit}")
    embedder = default_embedder()
    index = PassageIndex.load(index_dir, embedder) if PassageIndex.exists(index_dir) else PassageIndex(embedder)
    t = time.perf_counter()
    added = index.add(texts)
    index.save(index_dir)
    index_s = time.perf_counter() - t
    print(f"index: {added} new passages embedded ({len(index.texts)} in all) in {index_s:.1f}s")
    return index, added, index_s


def cmd_demo(args) -> int:
    from .tools.datasets import pydoc_passages
    from .tools.demo_index import KV_DIR

    started, record = time.perf_counter(), _run_record(args.model)
    index_dir = Path(args.dir or demo_dir(args.model))
    engine = _engine(args, index_dir / KV_DIR, warm_on_miss=True)
    load_s = time.perf_counter() - started
    passages = pydoc_passages(engine.count_tokens, args.max_tokens)
    print(f"corpus: {len(passages)} passages from pydoc_data.topics (<= {args.max_tokens} tokens each)")
    index, built = _build(engine, index_dir, [p.text for p in passages], args.warm_limit)
    answers = []
    for q in [*DEMO_QUESTIONS[: args.questions], *DEMO_QUESTIONS[:1]]:  # the first again: now all hits
        # One paragraph: past its first paragraph the 135M model mostly repeats itself.
        answers.append(_answer(engine, index, q, args.top_k, args.ratio, 96, compare=len(answers) < args.questions,
                               stop=["\n\n"]))
        answers[-1]["since_start_s"] = time.perf_counter() - started
        _warm_misses(engine, answers[-1])
    if args.run_file:
        record.model = engine.name
        record.write(args.run_file, {"total_s": time.perf_counter() - started, "model_load_s": load_s, **built,
                                     "answers": answers})
    return 0


def _warm_misses(engine, answer: dict) -> None:
    """Waits for warm on miss to store what ``answer``'s prompt missed (it runs after the answer,
    while nothing else runs; waited for here so the next question and the next process see it)."""
    if not answer["chunk_misses"]:
        return
    t = time.perf_counter()
    engine.warm_pending()
    answer["warm_on_miss_s"] = time.perf_counter() - t
    print(f"   warmed the {answer['chunk_misses']} missed passages on miss ({answer['warm_on_miss_s']:.1f}s, after "
          f"the answer): the next prompt holding them reuses their KV")


def _run_record(model: str):
    from .tools.runrecord import RunRecord

    return RunRecord.start(" ".join(["cacheblend", *sys.argv[1:]]), model)


def cmd_warm(args) -> int:
    from .tools.datasets import pack_paragraphs

    engine = _engine(args, None)
    texts = _read_source(Path(args.source), lambda text: pack_paragraphs(text, engine.count_tokens, args.max_tokens))
    if not texts:
        raise ValueError(f"no text found in {args.source}")
    if args.ray is None:
        if args.store is not None:
            raise ValueError("--store is for --ray (without it, warm writes the index's own store, DIR/cacheblend)")
        _build(engine, Path(args.dir), texts, args.warm_limit)
        return 0
    return _warm_on_ray(args, engine, texts)


def _warm_on_ray(args, engine, texts: list[str]) -> int:
    """``warm --ray``: the index is built here, the KV of its passages warmed by Ray actors into
    ``--store`` (default the index's store); exit 1 when a worker died before its part was stored."""
    from .distributed import RayWarmOptions, warm_corpus
    from .tools.demo_index import KV_DIR

    index_dir = Path(args.dir)
    index, _, _ = _index(index_dir, texts, args.warm_limit)
    store = args.store or index_dir / KV_DIR
    options = RayWarmOptions(address=args.ray, workers=args.ray_workers, threads=args.ray_threads)
    r = warm_corpus(index.texts[: args.warm_limit], model=args.model, store=store, config=engine.config, options=options)
    print(f"KV store {store}: {r.computed} records computed on Ray ({args.ray_workers} workers x {args.ray_threads} "
          f"threads: {r.per_worker}), {r.stored_before} of {r.records} already stored; {r.chunks} chunks in "
          f"{r.warm_s:.1f}s (+{r.load_s:.1f}s starting the workers)")
    if not r.complete:
        print(f"cacheblend: {len(r.missing)} records were not stored (workers {r.dead_workers} died): run the same "
              "command again to finish them", file=sys.stderr)
        return 1
    return 0


def cmd_ask(args) -> int:
    from .tools.demo_index import KV_DIR, PassageIndex, default_embedder

    index_dir = Path(args.dir)
    index = PassageIndex.load(index_dir, default_embedder())
    engine = _engine(args, index_dir / KV_DIR, warm_on_miss=True)
    _warm_misses(engine, _answer(engine, index, args.question, args.top_k, args.ratio, args.max_new_tokens,
                                 compare=args.compare))
    return 0


def _answer(engine, index, question: str, k: int, ratio, max_new_tokens: int, compare: bool, stop=None) -> dict:
    """Answers ``question`` with blending (and, with ``compare``, a full prefill); prints and returns
    the answers and their TTFTs."""
    chunks = index.search(question, k)
    order = [index.texts.index(c) for c in chunks]
    print(f"\nQ: {question}\n   retrieved passages (in prompt order): {order}")
    req = dict(chunks=chunks, query=question, max_new_tokens=max_new_tokens, stop=stop)
    out = engine.generate(**req, recompute_ratio=ratio)
    s = out.stats
    print(f"A: {out.text.strip()}")
    print(f"   blended: TTFT {s.ttft_s:.2f}s (KV load {s.load_s * 1000:.0f} ms), {s.prompt_tokens} prompt tokens: "
          f"{s.reused_tokens} reused, {s.recomputed_tokens} recomputed; chunks {s.chunk_hits} hit, {s.chunk_misses} missed")
    result = {"question": question, "answer": out.text.strip(), "ttft_s": s.ttft_s, "chunk_hits": s.chunk_hits,
              "chunk_misses": s.chunk_misses, "reused_tokens": s.reused_tokens, "prompt_tokens": s.prompt_tokens}
    if compare:
        full = engine.generate(**req, recompute_ratio=1.0)
        same = "same answer" if full.text.strip() == out.text.strip() else f"full-prefill answer: {full.text.strip()}"
        gain = (f"{full.stats.ttft_s / s.ttft_s:.1f}x faster with blending" if s.chunk_hits else
                "nothing was cached yet, so both computed every token")
        print(f"   full prefill: TTFT {full.stats.ttft_s:.2f}s -> {gain}; {same}")
        result |= {"full_answer": full.text.strip(), "full_ttft_s": full.stats.ttft_s,
                   "speedup": full.stats.ttft_s / s.ttft_s}
    return result


def _read_source(path: Path, split) -> list[str]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in {".txt", ".md"} and p.is_file())
        return [piece for f in files for piece in split(f.read_text(encoding="utf-8", errors="replace"))]
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if any("text" not in r for r in rows):
            raise ValueError(f"{path}: every line needs a 'text' field")
        return [r["text"] for r in rows if r["text"].strip()]
    if path.is_file():
        return split(path.read_text(encoding="utf-8", errors="replace"))
    raise FileNotFoundError(f"{path} does not exist")


def cmd_bench(args) -> int:
    from .tools import bench, bench_table
    from .tools.datasets import load_musique, pydoc_passages, pydoc_workload

    out = Path(args.out)
    store = Path(args.store) if args.store else out / "store"
    record = _run_record(args.model)
    engine = _engine(args, store)
    if args.dataset:
        examples = load_musique(args.dataset, args.chunks)[args.start : args.start + args.prompts]
        title = f"MuSiQue ({Path(args.dataset).name}, examples {args.start}-{args.start + len(examples) - 1})"
    else:
        passages = pydoc_passages(engine.count_tokens, min_tokens=384)  # about 512 tokens each
        examples = pydoc_workload(passages, args.prompts, args.chunks)
        title = "pydoc corpus"
    texts = sorted({p for ex in examples for p in ex.passages})
    engine.warm(texts, store_dir=store, progress=True)
    baseline = None
    if engine.kv.neighbours:  # CacheBlend's own warming (chunks alone) beside ours, in the same table
        from dataclasses import replace

        from .engine import BlendEngine

        baseline = BlendEngine(engine.adapter.model, engine.tokenizer, config=replace(engine.config, neighbours=0))
        # a folder of its own: its records' fingerprint differs, and a store holding only the other's warns
        baseline.warm(texts, store_dir=store.with_name(store.name + "-alone"), progress=True)
    ratios = tuple(float(x) for x in args.ratios.split(","))
    started = time.perf_counter()
    options = bench.BenchOptions(ratios=ratios, repeats=args.repeats, answer_tokens=args.answer_tokens)
    rows = bench.run(engine, examples, options=options, baseline=baseline)
    n_tokens = len(engine.request(chunks=examples[0].passages, query=examples[0].question).ids)
    title = f"{title}: {len(examples)} prompts of {args.chunks} chunks (~{n_tokens} tokens), {engine.name}, {engine.adapter.device}"
    rates = bench.throughput(engine, examples, rows)
    record.model = engine.name
    meta = {**record.meta(), "args": vars(args) | {"func": None}, "config": asdict(engine.config),
            "seconds": time.perf_counter() - started, "throughput": rates}
    print("\n" + bench_table.save(rows, out, title, meta))
    print(f"\nwarming {rates['warming_tokens_per_s']:.0f} chunk tokens/s ({rates['warming_computed_tokens_per_s']:.0f} "
          f"tokens/s computed, each chunk behind {engine.kv.neighbours} similar passage(s)) vs full prefill "
          f"{rates['full_prefill_tokens_per_s']:.0f} tokens/s")
    print(f"\nwrote {out / 'bench.md'}, {out / 'bench.json'}, {out / 'bench.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
