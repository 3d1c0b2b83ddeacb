"""A confidence gate on the blend: does the blend's own certainty say when its answer will differ
from full prefill's, and what does re-blending the uncertain requests at a larger budget buy?

    .venv/bin/python benchmarks/gate_eval.py docs/runs/gate_dev.json --base "nb1 deviation" --escalate "nb1 deviation 50%"
    .venv/bin/python benchmarks/gate_eval.py --quick

Reads select_eval.py run files (their per-question rows; no model runs here). Per request the
blend's confidence is the probability margin between its two likeliest first answer tokens
(``margin``: known after the prefill, before any token is sent) or the smallest such margin along
its own greedy answer (``margin_min``: known only once the answer is decoded). For each method:
the AUC of low confidence for "the answer differs from full prefill's" and for "an answer full
prefill gets right is lost". Then gated policies: run ``--base``; when its first-token margin is
below a threshold, run ``--escalate`` too and answer from it. The cost counts both passes: the
mean recomputed share is base's plus escalate's on the requests escalated. Thresholds are fitted
on the first file (the development split) at every escalated share in ``--shares``, then applied
unchanged to the others (reporting splits); ``--thresholds`` gives them instead (one threshold for
several development sets of one model).

``--signal draft_margin --choose``: an adaptive budget rather than a gate. A draft selector's stage
1 decodes full reuse's answer before stage 2 picks what to recompute, so how sure full reuse was of
the draft's least sure token (``BlendStats.draft_margin``) is known before either budget runs:
every request runs one method, ``--escalate`` where the margin is below the threshold, ``--base``
elsewhere; the cost is the one it ran. The signal is read from ``--escalate``'s rows (its stage 1 is
the base's where both draft; the base may be full reuse, which drafts nothing).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from runfile import ROOT, RunRecord, add_common

QUICK_INPUT = ROOT / "docs" / "runs" / "gate_dev.json"
SHARES = "0.1,0.2,0.3,0.5"


def auc(scores: list[float], labels: list[bool]) -> float | None:
    """P(score of a positive > score of a negative), ties counting half; None without both kinds."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return None
    return sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))


def reused_share(share: float, uncached: float) -> float:
    """A recomputed share of the prompt as a share of the reused tokens (``uncached``: the prompt share
    full reuse recomputes, the tokens no record covers)."""
    return (share - uncached) / (1 - uncached) if uncached < 1 else 0.0


SIGNALS = ("margin", "margin_min", "draft_margin")


def signals(rows: dict, method: str) -> dict:
    """AUC of low ``margin`` / ``margin_min`` / ``draft_margin`` (None where the method drafts
    nothing, or the run file predates it) for a changed answer and for a lost one."""
    r, full = rows[method], rows["full prefill"]["right"]
    changed = [not a for a in r["agree"]]
    lost = [bool(f) and not m for f, m in zip(full, r["right"])] if full and full[0] is not None else None
    out = {}
    for sig in SIGNALS:
        if not r.get(sig) or r[sig][0] is None:
            out[sig] = {"changed": None, "lost": None}
            continue
        low = [-x for x in r[sig]]
        out[sig] = {"changed": auc(low, changed), "lost": None if lost is None else auc(low, lost)}
    return out


def gate(rows: dict, base: str, escalate: str, threshold: float, signal: str = "margin", choose: bool = False) -> dict:
    """The policy "base, then escalate when base's ``signal`` < threshold" over ``rows``; with
    ``choose``, "escalate instead of base when escalate's ``signal`` < threshold" (the module docstring)."""
    b, e, full = rows[base], rows[escalate], rows["full prefill"]["right"]
    up = [m < threshold for m in (e if choose else b)[signal]]
    pick = lambda key: [y if u else x for x, y, u in zip(b[key], e[key], up)]  # noqa: E731
    right, agree = pick("right"), pick("agree")
    cost = [(y if u else x) if choose else x + (y if u else 0.0) for x, y, u in zip(b["share"], e["share"], up)]
    out = {"threshold": threshold, "escalated": statistics.mean(up), "agree": sum(agree), "kl": statistics.mean(pick("kl")),
           "f1": statistics.mean(pick("f1")), "share": statistics.mean(cost)}
    if full and full[0] is not None:
        out["kept"] = sum(bool(f and m) for f, m in zip(full, right))
    reuse = rows.get("nb1 reuse") or rows.get("reuse")
    if reuse is not None:  # the mean recompute as a share of the reused tokens, both passes counted
        out["reused_share"] = statistics.mean(reused_share(c, u) for c, u in zip(cost, reuse["share"]))
    return out


def fit(rows: dict, base: str, share: float, signal: str = "margin") -> float:
    """The threshold that escalates ``share`` of the requests (the base's ``signal`` quantile): halfway
    between the k-th lowest value and the next, 0 for none, above every margin for all."""
    margins = sorted(rows[base][signal])
    k = round(share * len(margins))
    if k == 0:
        return 0.0
    if k >= len(margins):
        return 1.01  # margins are at most 1
    return (margins[k - 1] + margins[k]) / 2


def fixed(rows: dict, method: str) -> dict:
    """A method alone, in the policies' terms."""
    return gate(rows, method, method, -1.0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, model=False, quick=f"{QUICK_INPUT.relative_to(ROOT)} alone, its first two blends")
    ap.add_argument("runs", nargs="*", help="select_eval.py run files: the first fits thresholds, all are evaluated")
    ap.add_argument("--base", default="nb1 deviation", help="the method every request runs")
    ap.add_argument("--escalate", default="nb1 deviation 50%", help="the method an uncertain request runs after it")
    ap.add_argument("--signal", default="margin", choices=SIGNALS,
                    help="margin: the first answer token's; margin_min: the least along the answer (known once decoded); "
                         "draft_margin: a draft's least sure token's (known before stage 2: use with --choose)")
    ap.add_argument("--choose", action="store_true",
                    help="the signal picks which one method runs (read from --escalate's rows), instead of gating a second")
    ap.add_argument("--shares", default=SHARES, help="shares of the first file's requests to escalate, comma-separated")
    ap.add_argument("--thresholds", default=None, help="the signal's thresholds, comma-separated (instead of --shares)")
    args = ap.parse_args(argv)
    if args.quick:
        args.runs = [str(QUICK_INPUT)]
    if not args.runs:
        ap.error("name at least one run file")
    record = RunRecord.start(args)
    runs = {p: json.loads(Path(p).read_text()) for p in args.runs}
    for path, run in runs.items():
        if "questions" not in run:
            raise SystemExit(f"{path} has no per-question rows (select_eval.py writes them since the confidence gate)")
        missing = {args.base, args.escalate} - set(run["questions"])
        if missing and not args.quick:
            raise SystemExit(f"{path} lacks the methods {sorted(missing)}")
    if args.quick:  # the first two blends of the file, whatever they are
        first = runs[args.runs[0]]["questions"]
        args.base, args.escalate = [m for m in first if m != "full prefill"][:2]
    dev = runs[args.runs[0]]["questions"]
    source = args.escalate if args.choose else args.base  # the rows the signal is read from
    if dev[source].get(args.signal, [None])[0] is None:
        raise SystemExit(f"{args.runs[0]}: {source} has no {args.signal} (it drafts nothing, or the run predates it)")
    thresholds = ([float(t) for t in args.thresholds.split(",")] if args.thresholds else
                  [fit(dev, source, float(s), args.signal) for s in args.shares.split(",")])
    out = {}
    for path, run in runs.items():
        rows = run["questions"]
        blends = [m for m in rows if m != "full prefill"]
        result = {"meta": run.get("meta"), "signals": {m: signals(rows, m) for m in blends},
                  "fixed": {m: fixed(rows, m) for m in blends},
                  "gated": [gate(rows, args.base, args.escalate, t, args.signal, args.choose) for t in thresholds]}
        out[path] = result
        print(report(path, result, args.base, args.escalate))
    record.write(args.run_file, {"base": args.base, "escalate": args.escalate, "signal": args.signal, "choose": args.choose,
                                 "fitted_on": args.runs[0], "runs": out})


def report(path: str, result: dict, base: str, escalate: str) -> str:
    head = " | ".join(f"AUC {sig}: changed | lost" for sig in SIGNALS)
    lines = [f"## {path}", "", f"| method | {head} |", "|---|" + "---|" * 2 * len(SIGNALS)]
    f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    for m, s in result["signals"].items():
        lines.append(f"| {m} | " + " | ".join(f"{f(s[sig]['changed'])} | {f(s[sig]['lost'])}" for sig in SIGNALS) + " |")
    lines += ["", f"| policy ({base} -> {escalate}) | escalated | kept | same answer | answer F1 vs full | mean KL | recomputed (prompt) | of reused |",
              "|---|---|---|---|---|---|---|---|"]
    for name, g in [*((m, r) for m, r in result["fixed"].items()), *((f"gate < {g['threshold']:.3f}", g) for g in result["gated"])]:
        lines.append(f"| {name} | {g['escalated']:.0%} | {g.get('kept', '-')} | {g['agree']} | {g['f1']:.3f} | {g['kl']:.4f} | "
                     f"{g['share']:.1%} | {f(g.get('reused_share'))} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
