"""The blend's CPU attention kernel: each row group as its visible prefix and the rest, merged, or as
one masked call. TTFT against full prefill and the compute floor, interleaved in one process.

    .venv/bin/python benchmarks/attention_split.py --start 50 --prompts 10 --repeats 3
    .venv/bin/python benchmarks/attention_split.py --model qwen2.5-0.5b-instruct --start 50 --prompts 10
    .venv/bin/python benchmarks/attention_split.py --quick     # 2 short pydoc prompts, 1 repeat

After a check layer the blend computes a sparse set of rows in contiguous groups; a group sees
every key before its first row and, past it, each row the keys up to its own position
(``blending/rows.py``). ``models/kernels.py`` runs a group as two calls of the CPU flash kernel
merged by their log-sum-exps ("split"); before it, one SDPA call with the group's whole mask
("masked"). For each MuSiQue prompt (the first 6 passages, the default config's warming in the
memory tier) this times, alternating and ``--repeats`` times, full prefill and the model's default
blend with each kernel (the masked side runs with ``rows.prefix_split`` switched off), and prints
per kernel the median TTFT, the speedup, the median per-prompt share of the compute floor
(``tools/bench.py``: rows and multiply-accumulates) and the largest logit difference between the
two kernels. Ratios within one run: absolute times on a shared machine are noisy.

``--ops``: where the blend's time goes against its floor. The first prompt's full prefill and split
blend run ``--repeats`` more times under torch's profiler; per ATen op, the blend's self time
beside the full prefill's scaled by the row floor's weight (the share of the full prefill's work
the floor expects the blend to do), largest excess first.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import cacheblend.blending.rows as rows_module
from cacheblend import BlendEngine
from cacheblend.tools.bench import QA_PREFIX
from cacheblend.tools.cost import prefill_macs, prefill_rows
from cacheblend.tools.datasets import load_musique, pydoc_passages, pydoc_workload
from runfile import ROOT, RunRecord, add_common

KERNELS = {"split": rows_module.prefix_split, "masked": lambda device: False}


def timed(engine: BlendEngine, req: dict, kernel: str | None):
    """One prefill (full when ``kernel`` is None), its decode cache built: (seconds, Prefilled)."""
    rows_module.prefix_split = KERNELS[kernel or "split"]
    started = time.perf_counter()
    pre = engine.prefill(**req, recompute_ratio=1.0) if kernel is None else engine.prefill(**req)
    pre.cache()
    return time.perf_counter() - started, pre


def op_times(engine: BlendEngine, req: dict, kernel: str | None, repeats: int) -> dict[str, float]:
    """Seconds of self CPU time per ATen op, per prefill (the mean over ``repeats``)."""
    from torch.profiler import profile

    with profile() as prof:
        for _ in range(repeats):
            timed(engine, req, kernel)
    return {e.key: e.self_cpu_time_total / 1e6 / repeats for e in prof.key_averages()}


def op_excess(engine: BlendEngine, req: dict, weight: float, repeats: int) -> dict:
    """``--ops``: the blend's op times against the full prefill's times ``weight``."""
    full, blend = op_times(engine, req, None, repeats), op_times(engine, req, "split", repeats)
    ops = [{"op": k, "full_s": full.get(k, 0.0), "blend_s": blend.get(k, 0.0),
            "excess_s": blend.get(k, 0.0) - weight * full.get(k, 0.0)} for k in set(full) | set(blend)]
    ops.sort(key=lambda o: -o["excess_s"])
    total = {"full_s": sum(full.values()), "blend_s": sum(blend.values()), "weight": weight}
    print(f"ops, first prompt: blend {total['blend_s']:.3f}s against {weight:.3f} x full {total['full_s']:.3f}s "
          f"= {weight * total['full_s']:.3f}s")
    for o in ops[:12]:
        print(f"  {o['op']:<52} blend {o['blend_s']:.3f}s, floor's share of full {weight * o['full_s']:.3f}s, "
              f"excess {o['excess_s']:+.3f}s")
    return {"total": total, "ops": [o for o in ops if abs(o["excess_s"]) >= 5e-4]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, quick="2 prompts of 2 pydoc passages of up to 96 tokens, 1 repeat")
    ap.add_argument("--dataset", default=str(ROOT.parent / "shared" / "data" / "musique_s.json"))
    ap.add_argument("--start", type=int, default=50, help="first MuSiQue example (50-149: the reporting split)")
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ops", action="store_true", help="profile the first prompt: the blend's time per op against its floor")
    args = ap.parse_args(argv)
    record = RunRecord.start(args)
    engine = BlendEngine.from_pretrained(args.model)
    if args.quick:
        args.repeats = 1
        examples = pydoc_workload(pydoc_passages(engine.count_tokens, 96), 2, 2)
    else:
        examples = load_musique(Path(args.dataset), 6)[args.start:args.start + args.prompts]
    prompts, ops = [], None
    for i, ex in enumerate(examples):
        engine.warm(ex.passages, progress=False)
        req = dict(chunks=ex.passages, query=ex.question, prefix=QA_PREFIX)
        times = {"full": [], "split": [], "masked": []}
        out = {}
        for _ in range(args.repeats):
            for kernel in (None, "split", "masked"):
                seconds, out[kernel or "full"] = timed(engine, req, kernel)
                times[kernel or "full"].append(seconds)
        med = {k: statistics.median(v) for k, v in times.items()}
        share = out["split"].stats.recomputed_tokens / out["split"].stats.prompt_tokens
        macs = prefill_macs(engine.adapter, out["full"].output).total / prefill_macs(engine.adapter, out["split"].output).total
        row = {"prompt_tokens": out["full"].stats.prompt_tokens, "recomputed_share": share, "ttft_s": med,
               "floor": prefill_rows(out["full"].output) / prefill_rows(out["split"].output), "mac_floor": macs,
               "logits_max_diff": float((out["split"].output.logits - out["masked"].output.logits).abs().max())}
        for kernel in ("split", "masked"):
            speedup = med["full"] / med[kernel]
            row[kernel] = {"speedup": speedup, "of_floor": speedup / row["floor"], "of_mac_floor": speedup / macs}
        prompts.append(row)
        print(f"[{i + 1}/{len(examples)}] {row['prompt_tokens']} tokens, {share:.1%} recomputed: full {med['full']:.2f}s, "
              f"split {med['split']:.2f}s ({row['split']['of_floor']:.2f} of floor), masked {med['masked']:.2f}s "
              f"({row['masked']['of_floor']:.2f}); logits differ by {row['logits_max_diff']:.1e}")
        if args.ops and i == 0:
            ops = op_excess(engine, req, 1 / row["floor"], args.repeats)
    rows_module.prefix_split = KERNELS["split"]
    summary = {k: {m: statistics.median(p[k][m] for p in prompts) for m in ("speedup", "of_floor", "of_mac_floor")}
               for k in ("split", "masked")}
    summary["split_over_masked"] = statistics.median(p["ttft_s"]["masked"] / p["ttft_s"]["split"] for p in prompts)
    for k in ("split", "masked"):
        s = summary[k]
        print(f"{k}: median speedup {s['speedup']:.2f}x, of floor per prompt {s['of_floor']:.2f} (rows), "
              f"{s['of_mac_floor']:.2f} (MACs)")
    print(f"masked / split TTFT, median per prompt: {summary['split_over_masked']:.3f}")
    record.write(args.run_file, {"config": repr(engine.config), "start": args.start, "repeats": args.repeats,
                                 "summary": summary, "prompts": prompts, "ops": ops})


if __name__ == "__main__":
    main()
