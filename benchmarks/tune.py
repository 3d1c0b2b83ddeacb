"""Measures the engine's tunable choices on the development split and prints markdown tables.

    .venv/bin/python benchmarks/tune.py --prompts 8            # pydoc prompts, 6 x ~512 tokens
    .venv/bin/python benchmarks/tune.py --musique ../shared/data/musique_s.json --prompts 8
    .venv/bin/python benchmarks/tune.py --quick      # 1 prompt of 2 short passages, 2 sweep settings

Each row: mean KL(full prefill || blend) over the full-prefill answer's tokens (lower is closer)
and the recomputed share of the prompt. Only
development examples are used (pydoc prompts from seed 1; MuSiQue examples 0-49).
"""

from __future__ import annotations

import argparse
import statistics
import time

from cacheblend import BlendConfig, BlendEngine, shared_engine
from cacheblend.tools.datasets import load_musique, pydoc_passages, pydoc_workload
from cacheblend.tools.quality import answer_kl
from runfile import RunRecord, add_common

ANSWER_TOKENS = 24


def measure(examples, settings: dict[str, tuple[BlendEngine, BlendConfig]], reference: BlendEngine) -> dict:
    """Setting name -> [(KL, recomputed share)] per example; full prefill computed once per example."""
    out: dict[str, list] = {name: [] for name in settings}
    for i, ex in enumerate(examples):
        req = dict(chunks=ex.passages, query=ex.question)
        full = reference.prefill(**req, recompute_ratio=1.0)
        answer = reference.generate_from(full, max_new_tokens=ANSWER_TOKENS)
        for name, (engine, cfg) in settings.items():
            pre = engine.prefill(**req, config=cfg.with_kv_of(engine.config))  # the settings vary the blend only
            kl = answer_kl(full, pre, answer.token_ids)
            out[name].append((kl, pre.stats.recomputed_tokens / pre.stats.prompt_tokens))
        print(f"  example {i + 1}/{len(examples)} done", flush=True)
    return out


def table(title: str, results: dict[str, list]) -> str:
    lines = [f"### {title}", "", "| setting | mean KL | median KL | recomputed share |", "|---|---|---|---|"]
    for name, rows in results.items():
        kls = [r[0] for r in rows]
        share = statistics.mean(r[1] for r in rows)
        lines.append(f"| {name} | {statistics.mean(kls):.4f} | {statistics.median(kls):.4f} | {share:.1%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, quick="1 pydoc prompt of 2 passages of up to 96 tokens, the context rows and 2 sweep settings")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--musique", help="MuSiQue-format JSON; uses examples 0-49 only")
    ap.add_argument("--chunks", type=int, default=6)
    ap.add_argument("--chunk-tokens", type=int, default=512, help="pydoc passages of at most this, at least 3/4 of it")
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.chunks, args.chunk_tokens, args.musique = 1, 2, 96, None
    record = RunRecord.start(args)

    base = shared_engine(args.model)
    model, tok = base.adapter.model, base.tokenizer
    if args.musique:
        examples = load_musique(args.musique, args.chunks)[:50][: args.prompts]
    else:
        passages = pydoc_passages(base.count_tokens, args.chunk_tokens, min_tokens=args.chunk_tokens * 3 // 4)
        examples = pydoc_workload(passages, args.prompts, args.chunks, seed=1)
    texts = sorted({p for ex in examples for p in ex.passages})
    started = time.time()

    engines = {}
    for context in ("none", "bos", "system"):
        engines[context] = BlendEngine(model, tok, config=BlendConfig(chunk_context=context, neighbours=0))
        engines[context].warm(texts)
    engine = engines["system"]
    settings = {}
    for context, eng in engines.items():  # 1. what each chunk's KV is computed behind
        settings[f"context={context}, deviation V 15%"] = (eng, BlendConfig(chunk_context=context))
        settings[f"context={context}, full reuse"] = (eng, BlendConfig(chunk_context=context, ratios=(0.0,)))
    sweep = {  # 2. selector, measure and check layers (context=system)
        "random 15%": BlendConfig(selector="random"),
        "chunk start 15%": BlendConfig(selector="chunk_start"),
        "deviation K, layer 1, 15%": BlendConfig(measure="k"),
        "deviation KV, layer 1, 15%": BlendConfig(measure="kv"),
        "deviation V, layer 2, 15%": BlendConfig(check_layers=(2,)),
        "deviation V, layer 3, 15%": BlendConfig(check_layers=(3,)),
        "deviation V, layer 5, 15%": BlendConfig(check_layers=(5,)),
        "gradual V, layers 1,3: 30%,15%": BlendConfig(check_layers=(1, 3), ratios=(0.3, 0.15)),
        "gradual V, layers 1,2,4: 40%,25%,15%": BlendConfig(check_layers=(1, 2, 4), ratios=(0.4, 0.25, 0.15)),
        "deviation V, layer 1, 5%": BlendConfig(ratios=(0.05,)),
        "deviation V, layer 1, 30%": BlendConfig(ratios=(0.3,)),
    }
    if args.quick:
        sweep = dict(list(sweep.items())[:2])
    settings.update({name: (engine, cfg) for name, cfg in sweep.items()})
    results = measure(examples, settings, engine)
    print(table("Chunk context, selector, measure and check layers", results))
    print(f"\n{len(examples)} prompts, {len(texts)} chunks, {time.time() - started:.0f} s")
    record.write(args.run_file, {"prompts": len(examples), "chunks": len(texts),
                                 "results": {name: [{"kl": kl, "share": share} for kl, share in rows] for name, rows in results.items()}})


if __name__ == "__main__":
    main()
