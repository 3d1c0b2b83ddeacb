"""Fictional-fact lookups on the bundled model: accuracy and KL of blending vs full prefill.

    .venv/bin/python benchmarks/facts.py [--model M] [--run-file docs/runs/facts.json]
    .venv/bin/python benchmarks/facts.py --quick      # 2 questions, 2 settings, 8 answer tokens

24 questions (tests/core/facts.py), each over 6 passages of ~110 tokens (~750-token prompts),
the passage holding the fact third. Prints a markdown table: mean KL(full || blend) over the
full-prefill answer, answers containing the gold fact, and how many of the questions full
prefill answers correctly are still answered correctly. A second chunk order is run for full
prefill to show how much answers move under a mere reordering.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from runfile import RunRecord, add_common

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "core"))

from facts import FACTS, correct, passage, question  # noqa: E402

ORDER = (5, 11, 0, 17, 3, 8)
OTHER_ORDER = (8, 3, 17, 0, 11, 5)
PREFIX = "Answer briefly from the passages."
ALONE = dict(neighbours=0)  # CacheBlend's warming: each chunk computed alone
QUICK_SETTINGS = ("default (15%, 1 neighbour, first chunk's KV warmed alone)", "full reuse (alone)")


def settings() -> dict:
    """Setting name -> BlendConfig (built on call: importing cacheblend's config imports torch)."""
    from cacheblend import BlendConfig

    return {
        "default (15%, 1 neighbour, first chunk's KV warmed alone)": BlendConfig(),
        "1 neighbour for every chunk (no lead record), 15%": BlendConfig(lead_alone=False),
        "neighbours 2, 15%": BlendConfig(neighbours=2),
        "default, full reuse": BlendConfig(ratios=(0.0,)),
        "default at 30%": BlendConfig(ratios=(0.3,)),
        "default at 50%": BlendConfig(ratios=(0.5,)),
        "default at 70%": BlendConfig(ratios=(0.7,)),
        "CacheBlend 15% (deviation, chunks alone)": BlendConfig(**ALONE),
        "CacheBlend 30% (chunks alone)": BlendConfig(ratios=(0.3,), **ALONE),
        "deviation 15%, check layer 2 (alone)": BlendConfig(check_layers=(2,), **ALONE),
        "random 15% (alone)": BlendConfig(selector="random", **ALONE),
        "EPIC chunk start 15% (alone)": BlendConfig(selector="chunk_start", **ALONE),
        "full reuse (alone)": BlendConfig(ratios=(0.0,), **ALONE),
        "context=none, 15% (alone)": BlendConfig(chunk_context="none", **ALONE),
        "context=bos, 15% (alone)": BlendConfig(chunk_context="bos", **ALONE),
    }


def warming(cfg) -> tuple[str, int, bool]:
    """What a setting's chunk KV depends on: the engines that warm it differ only in this."""
    return cfg.chunk_context, cfg.neighbours, cfg.lead_alone and cfg.neighbours > 0


def run(model: str, count: int, chosen: dict, answer_tokens: int) -> dict:
    """Per setting: KL to full prefill and whether each of the first ``count`` answers is right."""
    from cacheblend import BlendConfig, BlendEngine, shared_engine
    from cacheblend.tools.quality import answer_kl

    shared = shared_engine(model)
    base = BlendEngine(shared.adapter.model, shared.tokenizer, config=BlendConfig(**ALONE))
    n = len(FACTS)
    texts = [passage(i) for i in range(n)]
    used = [texts[j] for j in sorted({(i + k) % n for i in range(count) for k in ORDER + OTHER_ORDER})]
    engines: dict[tuple[str, int, bool], BlendEngine] = {}
    for cfg in chosen.values():  # the passages the questions use (all 24 in a full run) are the neighbour pool
        if warming(cfg) not in engines:
            engines[warming(cfg)] = BlendEngine(base.adapter.model, base.tokenizer, config=cfg)
            engines[warming(cfg)].warm(used, progress=False)
    out = {"full prefill": [], "full prefill, passages reordered": [], **{name: [] for name in chosen}}
    for i in range(count):
        q, answers = question(i)
        req = dict(chunks=[texts[(i + k) % n] for k in ORDER], query=q, prefix=PREFIX)
        full = base.prefill(**req, recompute_ratio=1.0)
        reference = base.generate_from(full, max_new_tokens=answer_tokens)
        out["full prefill"].append((0.0, correct(reference.text, answers)))
        other = dict(req, chunks=[texts[(i + k) % n] for k in OTHER_ORDER])
        moved = base.generate(**other, recompute_ratio=1.0, max_new_tokens=answer_tokens).text
        out["full prefill, passages reordered"].append((None, correct(moved, answers)))
        for name, cfg in chosen.items():
            pre = engines[warming(cfg)].prefill(**req, config=cfg)
            right = correct(base.generate_from(pre, max_new_tokens=answer_tokens).text, answers)
            out[name].append((answer_kl(full, pre, reference.token_ids), right))
    return out


def summarize(per_question: dict) -> list[dict]:
    """One row per setting: mean KL, answers right, and answers full prefill gets right kept."""
    full = [r for _, r in per_question["full prefill"]]
    rows = []
    for name, results in per_question.items():
        kls = [k for k, _ in results if k is not None]
        rows.append({"setting": name, "mean_kl": statistics.mean(kls) if kls else None,
                     "correct": sum(r for _, r in results), "kept": sum(a and r for a, (_, r) in zip(full, results))})
    return rows


def table(rows: list[dict], count: int) -> str:
    full = rows[0]["correct"]
    lines = [f"| setting | mean KL vs full | correct (of {count}) | kept (of the {full} full prefill gets right) |",
             "|---|---|---|---|"]
    for r in rows:
        kl = "-" if r["mean_kl"] is None else ("0" if r["setting"] == "full prefill" else f"{r['mean_kl']:.4f}")
        lines.append(f"| {r['setting']} | {kl} | {r['correct']} | {r['kept']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, quick="2 questions, 2 settings, 8 answer tokens")
    ap.add_argument("--count", type=int, default=len(FACTS), help=f"questions (of {len(FACTS)})")
    ap.add_argument("--answer-tokens", type=int, default=24)
    ap.add_argument("--settings", default=None, help="setting names separated by ';' (default: all)")
    args = ap.parse_args(argv)
    if args.quick:
        args.count, args.answer_tokens, args.settings = 2, 8, ";".join(QUICK_SETTINGS)
    if not 1 <= args.count <= len(FACTS):
        ap.error(f"--count must be 1..{len(FACTS)}")
    record = RunRecord.start(args)
    every = settings()
    names = args.settings.split(";") if args.settings else list(every)
    unknown = [n for n in names if n not in every]
    if unknown:
        ap.error(f"unknown settings {unknown}; known: {'; '.join(every)}")
    rows = summarize(run(args.model, args.count, {n: every[n] for n in names}, args.answer_tokens))
    print(table(rows, args.count))
    record.write(args.run_file, {"questions": args.count, "answer_tokens": args.answer_tokens, "rows": rows})


if __name__ == "__main__":
    main()
