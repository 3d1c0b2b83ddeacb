"""Selector experiments on the generated fact set (cacheblend.tools.factset): accuracy, agreement and KL.

    .venv/bin/python benchmarks/select_eval.py --split dev --count 120 --methods reuse,deviation,query

One engine, warmed once; per question one full prefill (the reference), then every method:
accuracy (greedy short answer contains the gold string), agreement (the same answer as full
prefill), mean KL(full || method) over the full-prefill answer's tokens, recomputed share, and
the median ratio of its prefill time to full prefill's (short prompts: a rough guide only).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cacheblend import BlendConfig, shared_engine
from cacheblend.tools.factset import correct, questions
from cacheblend.selection import (
    ChunkStartSelector,
    CombinedSelector,
    DeviationSelector,
    QuerySelector,
    RandomSelector,
    SinkSelector,
)

PREFIX = "Answer briefly from the passages."
DEV = DeviationSelector("v")
STOP = [".", "\n"]
C = BlendConfig()
# name -> (config: schedule, ratio, fresh_check; selector: overrides config.selector when given)
METHODS = {
    "reuse": (BlendConfig(ratios=(0.0,)), None),
    "deviation": (C, None),
    "deviation 30%": (BlendConfig(ratios=(0.3,)), None),
    "random": (C, RandomSelector(0)),
    "chunk_start": (C, ChunkStartSelector()),
    "deviation+fresh": (BlendConfig(fresh_check=True), None),
    "deviation+sinks2": (C, SinkSelector(DEV, 2)),
    "deviation+sinks4": (C, SinkSelector(DEV, 4)),
    "query mean": (C, QuerySelector("mean")),
    "query max": (C, QuerySelector("max")),
    "query mean L2": (BlendConfig(check_layers=(2,)), QuerySelector("mean")),
    "query mean L4": (BlendConfig(check_layers=(4,)), QuerySelector("mean")),
    "q+d 0.5": (C, CombinedSelector(0.5)),
    "q+d 0.3": (C, CombinedSelector(0.3)),
    "q+d 0.7": (C, CombinedSelector(0.7)),
    "q+d 0.5 max": (C, CombinedSelector(0.5, heads="max")),
    "deviation L2": (BlendConfig(check_layers=(2,)), None),
    "gradual 1+4": (BlendConfig(check_layers=(1, 4), ratios=(0.3, 0.15)), None),
    "gradual 1+4 q+d": (BlendConfig(check_layers=(1, 4), ratios=(0.3, 0.15)), CombinedSelector(0.5)),
}


def run(split: str, count: int, names: list[str], answer_tokens: int, log=print) -> dict[str, dict]:
    engine = shared_engine()
    qs = questions(split, count)
    engine.warm(sorted({p for q in qs for p in q.passages}), progress=False)
    default_cfg = engine.config
    rows = {n: {"right": [], "agree": [], "kl": [], "share": [], "time": []} for n in ["full prefill", *names]}
    started = time.time()
    try:
        for i, q in enumerate(qs):
            req = dict(chunks=q.passages, query=q.question, prefix=PREFIX)
            full = engine.prefill(**req, recompute_ratio=1.0)
            ref = engine.generate_from(full, max_new_tokens=answer_tokens, stop=STOP)
            _record(rows["full prefill"], correct(ref.text, q.answers), True, 0.0, 1.0, 1.0)
            for name in names:
                cfg, sel = METHODS[name]
                engine.config, engine.selector = cfg, sel
                pre = engine.prefill(**req)
                kl, same = _compare(full, pre, ref, engine.eos_ids)
                text = ref.text if same else engine.generate_from(pre, max_new_tokens=answer_tokens, stop=STOP).text
                share = pre.stats.recomputed_tokens / pre.stats.prompt_tokens
                ratio = pre.stats.prefill_s / full.stats.prefill_s
                _record(rows[name], correct(text, q.answers), text.strip() == ref.text.strip(), kl, share, ratio)
            if (i + 1) % 20 == 0:
                log(f"  {i + 1}/{len(qs)} questions, {time.time() - started:.0f} s", flush=True)
    finally:
        engine.config, engine.selector = default_cfg, None
    return rows


def _compare(full, pre, ref, eos_ids) -> tuple[float, bool]:
    """KL(full || pre) over the reference answer, and whether greedy decoding from ``pre`` would
    produce the reference answer (the argmax at every teacher-forced step is the reference's
    token, and EOS where the reference ended with it): if so, no need to decode again."""
    ids = ref.token_ids
    p = torch.log_softmax(full.continuation_logits(ids), dim=-1)  # [T+1, vocab]
    q = torch.log_softmax(pre.continuation_logits(ids), dim=-1)
    kl = float((p.exp() * (p - q)).sum(-1).clamp_min(0.0).mean())
    greedy = q.argmax(-1).tolist()
    same = greedy[: len(ids)] == list(ids)
    if ref.stats.finish_reason == "stop" and p[-1].argmax().item() in eos_ids:
        same = same and greedy[-1] in eos_ids
    return kl, same


def _record(row, right, agree, kl, share, ratio) -> None:
    for key, value in zip(("right", "agree", "kl", "share", "time"), (right, agree, kl, share, ratio)):
        row[key].append(value)


def table(rows: dict[str, dict]) -> str:
    full = rows["full prefill"]["right"]
    k = sum(full)
    n = len(full)
    lines = [
        f"| method | accuracy (of {n}) | kept (of {k}) | same answer as full | mean KL | recomputed | prefill time vs full |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        kept = sum(a and b for a, b in zip(full, r["right"]))
        lines.append(
            f"| {name} | {statistics.mean(r['right']):.3f} | {kept} | {statistics.mean(r['agree']):.3f} "
            f"| {statistics.mean(r['kl']):.4f} | {statistics.mean(r['share']):.1%} | {statistics.median(r['time']):.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--split", default="dev", choices=("dev", "report"))
    ap.add_argument("--count", type=int, default=120)
    ap.add_argument("--methods", default="reuse,deviation,random,chunk_start")
    ap.add_argument("--answer-tokens", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 suits shared CPUs)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    names = args.methods.split(",")
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; known: {', '.join(METHODS)}")
    started = time.time()
    rows = run(args.split, args.count, names, args.answer_tokens)
    print(table(rows))
    print(f"\n{args.split} split, {args.count} questions, {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
