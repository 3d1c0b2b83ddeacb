"""The adaptive recompute budget (recompute_ratio="auto"): which per-request signal predicts that the
15% blend's answer differs from full prefill's, and what a signal -> ratio policy buys.

    .venv/bin/python benchmarks/budget_eval.py --sets facts=30,pydoc=8,musique=12 --run-file docs/runs/budget_dev.json
    .venv/bin/python benchmarks/budget_eval.py --quick      # 2 dev fact questions, 2 ratios

Per request (the default config: each chunk warmed behind 1 neighbour, lead records, deviation at
check layer 1): full prefill and its greedy answer (--answer-tokens, stopping at "." or a line
break) are the reference; then the blend at every --ratios value, each compared with it by
teacher forcing: the same answer (greedy decoding from the blend would give the same tokens) and
KL(full || blend) over the answer. The 15% blend runs as auto with both bounds at 15% (the same
blend bit for bit: tests/core/test_budget.py), recording every check-layer signal
(cacheblend.blending.budget); a full-reuse pass scores the question's stage-1 attention
(question_other / question_entropy: the share of the question's attention on reused tokens outside
the chunk it reads most, and that attention's entropy over the chunks, fused over all layers or
the last third), and logit_kl is KL between the 15% blend's and full reuse's first-token logits.

label = 1 when the 15% answer differs from full prefill's or its KL is in the top third of the
run's requests; AUC of each signal for it, per set and pooled. Then policies: with bounds
(min, max), a request gets max when its signal is at least a threshold, min otherwise. Without
--policies, thresholds are fitted here (development data only) so that the mean ratio is <= 15%;
their curve is simulated from the fixed-ratio results (exact: the signal does not depend on the
ratio), and the fitted policies of the best check-layer signal are also run for real. --policies
gives fixed ones (signal:min:max:threshold, ';'-separated), run for real: what a reporting split needs.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path

from runfile import ROOT, RunRecord, add_common

MUSIQUE = str(ROOT.parent / "shared" / "data" / "musique_s.json")
RATIOS = "0,0.05,0.1,0.15,0.2,0.3"
BOUNDS = "0:0.3,0.05:0.3,0.1:0.3,0.05:0.2,0.1:0.2"
STAGE1 = ("question_other", "question_entropy", "question_other_last3", "question_entropy_last3", "logit_kl")
TARGET = 0.15  # fitted policies keep the mean ratio at or below this


def reference(engine, q, answer_tokens: int, refs: dict, key: tuple):
    """Full prefill's greedy answer for ``q``: (log-probs along it, its ids, whether it ends in EOS), kept in ``refs``."""
    import torch
    from select_eval import PREFIX, STOP

    if key not in refs:
        full = engine.prefill(chunks=q.passages, query=q.question, prefix=PREFIX, recompute_ratio=1.0)
        ref = engine.generate_from(full, max_new_tokens=answer_tokens, stop=STOP)
        p = torch.log_softmax(full.continuation_logits(ref.token_ids), dim=-1)
        ends_eos = ref.stats.finish_reason == "stop" and p[-1].argmax().item() in engine.eos_ids
        refs[key] = (p, ref.token_ids, ends_eos, ref.text, full.stats.prompt_tokens)
    return refs[key]


def auto_config(engine, signal: str, lo: float, hi: float, threshold: float):
    return replace(engine.config.with_ratio("auto"), auto_signal=signal, auto_min_ratio=lo, auto_max_ratio=hi,
                   auto_threshold=threshold)


def request_rows(engine, dataset: str, qs: list, ratios: list[float], answer_tokens: int, refs: dict, log) -> list[dict]:
    from select_eval import PREFIX, _compare

    from cacheblend.blending import budget

    rows = []
    for i, q in enumerate(qs):
        req = dict(chunks=q.passages, query=q.question, prefix=PREFIX)
        p, ids, ends_eos, text, prompt_tokens = reference(engine, q, answer_tokens, refs, (dataset, i))
        row = {"set": dataset, "index": i, "prompt_tokens": prompt_tokens, "answer": text, "ratios": {}}
        for r in ratios:
            if r == 0.15:  # as auto with both bounds at 15%: the same blend, with every signal recorded
                with budget.recording() as seen:
                    pre = engine.prefill(**req, config=auto_config(engine, "deviation", 0.15, 0.15, 0.0))
                row.update({k: v for k, v in seen[0].items() if k != "ratio"})
                first15 = pre.output.logits.float()
            else:
                pre = engine.prefill(**req, recompute_ratio=r)
            kl, top1, same, _ = _compare(p, pre, ids, ends_eos, engine.eos_ids)
            row["ratios"][str(r)] = {"same": same, "kl": kl, "top1": top1,
                                     "share": pre.stats.recomputed_tokens / pre.stats.prompt_tokens}
            row.setdefault("reused_tokens", pre.stats.hit_tokens)
        row.update(stage1(engine, req, first15))
        rows.append(row)
        log(f"{dataset} {i + 1}/{len(qs)}: 15% same={row['ratios'].get('0.15', {}).get('same')} "
            f"deviation={row['deviation']:.4g}", flush=True)
    return rows


def stage1(engine, req: dict, first15) -> dict:
    """The full-reuse pass's signals: the question's attention over the chunks (fused over every
    layer, and over the last third) and KL between the 15% blend's and full reuse's first token."""
    import torch

    from cacheblend.blending.blend import reuse_pass
    from cacheblend.blending.check import Check
    from cacheblend.blending.budget import chunk_spread
    from cacheblend.blending.question import Fusion, QuestionScore, chunk_ids
    from cacheblend.blending.selection import NoneSelector
    from cacheblend.prompts.assemble import assemble, chunk_encodings

    request = engine.request(**req)
    chunks = chunk_encodings(request.text, engine.kv.encode)
    lookup = engine.kv.records  # the record lookup a prefill makes
    asm = assemble(request.text, request.encoding, chunks, list(lookup([c.ids for c in chunks])), engine.adapter.device)
    inp = asm.input
    asking = Check.of(inp, NoneSelector()).asking
    out, ids = {}, chunk_ids(inp.reused, inp.chunk_offsets)
    for layers, tail in (("all", ""), ("last_third", "_last3")):
        score = QuestionScore(engine.adapter, asking, Fusion(layers))
        reuse = reuse_pass(engine.adapter, inp, score)
        other, entropy = chunk_spread(score.score(inp.reused, inp.chunk_offsets), ids)
        out[f"question_other{tail}"], out[f"question_entropy{tail}"] = other, entropy
    a, b = torch.log_softmax(first15, -1), torch.log_softmax(reuse.logits.float(), -1)
    out["logit_kl"] = float((a.exp() * (a - b)).sum())
    return out


def auc(scores: list[float], labels: list[int]) -> float | None:
    """P(score of a label-1 request > score of a label-0 one), ties counting half."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def labels(rows: list[dict]) -> list[int]:
    kls = sorted(r["ratios"]["0.15"]["kl"] for r in rows)
    top_third = kls[math.floor(len(kls) * 2 / 3)] if kls else 0.0
    return [int(not r["ratios"]["0.15"]["same"] or r["ratios"]["0.15"]["kl"] >= top_third) for r in rows]


def auc_table(rows: list[dict], signals: list[str]) -> dict:
    """signal -> {set: AUC, "pooled": AUC} (labels taken over the whole run)."""
    y = labels(rows)
    sets = sorted({r["set"] for r in rows})
    out = {}
    for s in signals:
        out[s] = {k: auc([r[s] for r in rows if r["set"] == k], [l for r, l in zip(rows, y) if r["set"] == k]) for k in sets}
        out[s]["pooled"] = auc([r[s] for r in rows], y)
    return out


def fit_threshold(values: list[float], lo: float, hi: float, target: float = TARGET) -> float:
    """The lowest threshold that sends at most the share (target - lo) / (hi - lo) of ``values`` to hi."""
    if hi <= lo:
        return math.inf
    k = math.floor(max(0.0, min(1.0, (target - lo) / (hi - lo))) * len(values) + 1e-9)
    desc = sorted(values, reverse=True)
    while 0 < k < len(desc) and desc[k] == desc[k - 1]:
        k -= 1  # ties at the cut would send more than k
    if k == 0:
        return math.inf
    return desc[k - 1] if k == len(desc) else (desc[k - 1] + desc[k]) / 2


def simulate(rows: list[dict], signal: str, lo: float, hi: float, threshold: float) -> dict:
    picks = [hi if r[signal] >= threshold else lo for r in rows]
    got = [r["ratios"][str(p)] for r, p in zip(rows, picks)]
    return point(got, picks)


def point(got: list[dict], picks: list[float]) -> dict:
    return {"mean_ratio": statistics.mean(picks), "same": sum(g["same"] for g in got), "of": len(got),
            "mean_kl": statistics.mean(g["kl"] for g in got), "mean_share": statistics.mean(g["share"] for g in got),
            "at_max": None}


def run_policies(engine, qs_by_set: dict, rows: list[dict], policies: list[tuple], answer_tokens: int, refs: dict,
                 log) -> dict:
    """Each policy run for real (recompute_ratio="auto" with its bounds and threshold) on every request."""
    from select_eval import PREFIX, _compare

    out = {}
    for signal, lo, hi, t in policies:
        cfg = auto_config(engine, signal, lo, hi, t)
        got, picks, mismatches = [], [], 0
        for row in rows:
            q = qs_by_set[row["set"]][row["index"]]
            p, ids, ends_eos, _, _ = reference(engine, q, answer_tokens, refs, (row["set"], row["index"]))
            pre = engine.prefill(chunks=q.passages, query=q.question, prefix=PREFIX, config=cfg)
            ratio = pre.output.ratio if pre.output.ratio is not None else 0.0
            kl, top1, same, _ = _compare(p, pre, ids, ends_eos, engine.eos_ids)
            got.append({"same": same, "kl": kl, "share": pre.stats.recomputed_tokens / pre.stats.prompt_tokens})
            picks.append(ratio)
            known = row["ratios"].get(str(ratio))
            mismatches += known is not None and (known["same"] != same or abs(known["kl"] - kl) > 1e-6)
        name = f"auto {signal} {lo:g}-{hi:g} t={t:.4g}"
        out[name] = {**point(got, picks), "at_max": sum(p == hi for p in picks), "vs_fixed_mismatches": mismatches}
        log(f"{name}: {out[name]}", flush=True)
    return out


def curves(rows: list[dict], ratios: list[float], signals: list[str], bounds: list[tuple]) -> tuple[dict, dict]:
    fixed = {f"fixed {r:g}": point([x["ratios"][str(r)] for x in rows], [r] * len(rows)) for r in ratios}
    fitted = {}
    for s in signals:
        for lo, hi in bounds:
            if str(lo) in rows[0]["ratios"] and str(hi) in rows[0]["ratios"]:
                t = fit_threshold([r[s] for r in rows], lo, hi)
                fitted[f"auto {s} {lo:g}-{hi:g}"] = {**simulate(rows, s, lo, hi, t), "threshold": t,
                                                     "at_max": sum(r[s] >= t for r in rows)}
    return fixed, fitted


def markdown(aucs: dict, fixed: dict, fitted: dict, real: dict) -> str:
    sets = [k for k in next(iter(aucs.values())) if k != "pooled"]
    lines = ["| signal | " + " | ".join(sets) + " | pooled |", "|---" * (len(sets) + 2) + "|"]
    for s, v in sorted(aucs.items(), key=lambda kv: -(kv[1]["pooled"] or 0)):
        lines.append(f"| {s} | " + " | ".join("-" if v[k] is None else f"{v[k]:.3f}" for k in [*sets, "pooled"]) + " |")
    lines += ["", "| policy | mean ratio | same answer | mean KL | recomputed share of prompt | at max |", "|---|---|---|---|---|---|"]
    for name, r in {**fixed, **fitted, **{f"{k} (run)": v for k, v in real.items()}}.items():
        lines.append(f"| {name} | {r['mean_ratio']:.3f} | {r['same']}/{r['of']} | {r['mean_kl']:.4f} "
                     f"| {r['mean_share']:.1%} | {'-' if r['at_max'] is None else r['at_max']} |")
    return "\n".join(lines)


def from_runs(args, record, policies: list[tuple]) -> None:
    """No model: the curves of earlier run files again, the --policies simulated on their rows
    (exact, as in a run), and with --plot the curves drawn, one panel per run file."""
    import json

    runs = [json.loads(Path(f).read_text()) for f in args.from_run]
    out = {}
    for f, run in zip(args.from_run, runs):
        sim = {f"auto {s} {lo:g}-{hi:g} t={t:.4g} (simulated)": {**simulate(run["rows"], s, lo, hi, t),
               "at_max": sum(r[s] >= t for r in run["rows"])} for s, lo, hi, t in policies}
        out[f] = {"model": run["run"]["model"], "simulated": sim}
        print(f"{f} ({run['run']['model']})\n{markdown(run['auc'], run['fixed'], {**run['fitted'], **sim}, run['policies'])}\n")
    if args.plot:
        plot(runs, [o["simulated"] for o in out.values()], args.plot)
    record.write(args.run_file, {"from_runs": out})


def plot(runs: list[dict], simulated: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4.5), squeeze=False)
    for ax, run, sim in zip(axes[0], runs, simulated):
        fixed = sorted(run["fixed"].values(), key=lambda r: r["mean_ratio"])
        ax.plot([r["mean_ratio"] for r in fixed], [r["same"] / r["of"] for r in fixed], "o-", color="k", label="fixed ratio")
        for name, r in {**run["fitted"], **sim}.items():
            if name.startswith("auto " + run["meta"].get("plot_signal", "deviation")) or "(simulated)" in name:
                ax.plot(r["mean_ratio"], r["same"] / r["of"], "s", alpha=0.6, label=name)
        for name, r in run["policies"].items():
            ax.plot(r["mean_ratio"], r["same"] / r["of"], "*", markersize=12, label=name + " (run)")
        ax.set_title(f"{run['run']['model']}: {run['meta']['sets']} ({run['meta']['split']})", fontsize=9)
        ax.set_xlabel("mean recompute ratio (of reused tokens)")
        ax.set_ylabel("answers the same as full prefill")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, quick="2 development fact questions, ratios 0 and 0.15, 8 answer tokens")
    ap.add_argument("--sets", default="facts=30,pydoc=8,musique=12", help="dataset=count,...: facts, pydoc, musique")
    ap.add_argument("--split", default="dev", choices=("dev", "report"))
    ap.add_argument("--start", type=int, default=0, help="skip each set's first START examples of the split")
    ap.add_argument("--musique", default=MUSIQUE, help="the MuSiQue-format JSON (default ../shared/data/musique_s.json)")
    ap.add_argument("--ratios", default=RATIOS, help="fixed ratios (0.15 must be one: the labels and signals come from it)")
    ap.add_argument("--bounds", default=BOUNDS, help="min:max pairs of the fitted auto policies")
    ap.add_argument("--policies", default=None, help="signal:min:max:threshold;...: run these instead of fitting")
    ap.add_argument("--answer-tokens", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--from-run", nargs="+", default=None, metavar="JSON",
                    help="run no model: print these run files' tables, simulate --policies on their rows, --plot them")
    ap.add_argument("--plot", default=None, metavar="PNG", help="with --from-run: the curves as a plot")
    args = ap.parse_args(argv)
    if args.quick:
        args.sets, args.ratios, args.answer_tokens, args.bounds = "facts=2", "0,0.15", 8, "0:0.15"
    if args.split == "report" and not args.policies and not args.from_run:
        ap.error("a reporting split takes fixed --policies (thresholds are fitted on development data only)")
    ratios = [float(x) for x in args.ratios.split(",")]
    if 0.15 not in ratios:
        ap.error("--ratios must include 0.15")
    bounds = [tuple(float(x) for x in b.split(":")) for b in args.bounds.split(",")]
    policies = [(s, float(a), float(b), float(t)) for s, a, b, t in
                (p.split(":") for p in args.policies.split(";"))] if args.policies else []
    record = RunRecord.start(args)
    if args.from_run:
        return from_runs(args, record, policies)

    import torch

    from cacheblend import BlendEngine, shared_engine
    from cacheblend.blending.budget import SIGNALS as CHECK_SIGNALS  # a check layer's (not a draft's: ADAPTIVE-BUDGET.md)
    from select_eval import examples

    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    shared = shared_engine(args.model)
    engine = BlendEngine(shared.adapter.model, shared.tokenizer, memory_bytes=8 << 30)  # the default config
    started = time.time()
    qs_by_set = {}
    for part in args.sets.split(","):
        name, count = part.split("=")
        qs_by_set[name] = examples(args.musique if name == "musique" else name, args.split, int(count), engine, args.start)
    engine.warm(sorted({p for qs in qs_by_set.values() for q in qs for p in q.passages}), progress=False)
    print(f"warmed in {time.time() - started:.0f} s", flush=True)
    refs: dict = {}
    rows = [r for name, qs in qs_by_set.items() for r in request_rows(engine, name, qs, ratios, args.answer_tokens, refs, print)]
    signals = [*CHECK_SIGNALS, *STAGE1]
    aucs = auc_table(rows, signals)
    fixed, fitted = curves(rows, ratios, signals, bounds) if args.split == "dev" else (curves(rows, ratios, [], [])[0], {})
    if not policies and args.split == "dev":
        best = max(CHECK_SIGNALS, key=lambda s: aucs[s]["pooled"] or 0)  # the cheap signals only
        policies = [(best, lo, hi, fitted[f"auto {best} {lo:g}-{hi:g}"]["threshold"]) for lo, hi in bounds
                    if f"auto {best} {lo:g}-{hi:g}" in fitted and math.isfinite(fitted[f"auto {best} {lo:g}-{hi:g}"]["threshold"])]
    real = run_policies(engine, qs_by_set, rows, policies, args.answer_tokens, refs, print)
    print(markdown(aucs, fixed, fitted, real))
    print(f"{len(rows)} requests, {args.split} split, {time.time() - started:.0f} s")
    record.write(args.run_file, {"meta": {"sets": args.sets, "split": args.split, "start": args.start,
                                          "ratios": ratios, "answer_tokens": args.answer_tokens, "labels_positive": sum(labels(rows))},
                                 "auc": aucs, "fixed": fixed, "fitted": fitted, "policies": real, "rows": rows})


if __name__ == "__main__":
    main()
