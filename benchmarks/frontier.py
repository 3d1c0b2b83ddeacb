"""The speed/quality frontier of every method (issue 10), from ``select_eval.py --json`` runs.

    .venv/bin/python benchmarks/frontier.py docs/frontier.png runs/pydoc.json runs/musique.json runs/facts.json
    .venv/bin/python benchmarks/frontier.py docs/frontier.png a.json+b.json   # one panel, two runs
    .venv/bin/python benchmarks/frontier.py --quick /tmp/frontier.png    # one committed run file

One panel per argument; ``a.json+b.json`` is one panel from runs over the same questions (the same
model, dataset, split and questions: a method both hold is taken from the first). x is the
prefill speedup over full prefill (the median ratio measured in the same run as the quality, one
thread), y the mean KL(full prefill || method) over the full-prefill answer (lower is better),
and a second row the answer F1 against full prefill's answer. Lines join one warming setting across recompute ratios (5%, 15%, 30%); the best methods
sit low and to the right.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from runfile import DEFAULT_MODEL, ROOT, RunRecord, add_common

QUICK_INPUT = ROOT / "docs" / "runs" / "select_pydoc_report.json"


def family(name: str) -> tuple[str, float]:
    """(curve label, recompute ratio) of a select_eval method name."""
    m = re.fullmatch(r"(nb\d+ )?lexical(?: (\d+)%)?", name)
    if m:
        return ("lexical, default warming" if m.group(1) else "lexical, warmed alone"), int(m.group(2) or 15) / 100
    m = re.fullmatch(r"nb1 lexical named(?: max(\d+))?", name)
    if m:  # the named chunk's budget, ordered along its curve by its cap (auto_max_ratio: 30% unless named)
        return "lexical, budget = the named chunk (auto, capped), default warming", int(m.group(1) or 30) / 100
    m = re.fullmatch(r"(nb\d+ )?(plain )?(deviation|reuse)(?: (\d+)%)?", name)
    if m:
        k = m.group(1).strip()[2:] if m.group(1) else "0"
        warm = "warmed alone (CacheBlend)" if k == "0" else f"warmed behind {k} neighbour{'s' * (k != '1')}"
        if k != "0":
            warm += " for every chunk" if m.group(2) else ", first chunk's KV warmed alone"
        ratio = 0.0 if m.group(3) == "reuse" else int(m.group(4) or 15) / 100
        return f"deviation, {warm}", ratio
    m = re.fullmatch(r"nb1 draft-only 8 last3( gap x)?(?: (\d+)%)?", name)
    if m:  # SmolLM2's default since stop 61 (gap x), the draft alone its default at stops 57-60
        label = "draft+gap (SmolLM2's default)" if m.group(1) else "draft"
        return f"{label}, default warming", int(m.group(2) or 15) / 100
    m = re.fullmatch(r"nb1 draft\+gap auto (\d+)-(\d+)% <[\d.]+", name)
    if m:  # one point: the budget the draft's margin picks per request (docs/ADAPTIVE-BUDGET.md)
        return f"draft+gap, budget by the draft's margin ({m.group(1)}-{m.group(2)}%, auto)", 0.15
    m = re.fullmatch(r"nb1 lexical\+question (\d+)%", name)
    if m:  # Qwen's default since stop 42
        return "lexical+question (Qwen's default), default warming", int(m.group(1)) / 100
    names = {
        "chunk_start": "chunk start, warmed alone (EPIC)",
        "random": "random, warmed alone",
        "full reversed": "full prefill, passages reversed (reference)",
        "full rotated": "full prefill, first passage moved last (reference)",
        "oracle": "oracle selection, warmed alone",
        "nb1 oracle": "oracle selection, default warming",
    }
    return names.get(name, name), 1.0 if name.startswith("full ") else 0.15


def panel(spec: str) -> dict:
    """One panel's data: the run file ``spec``, or ``a.json+b.json``, runs over the same questions
    merged (a method both hold comes from the first; a clear error if they are not the same set)."""
    runs = [json.loads(Path(path).read_text()) for path in spec.split("+")]
    same = {(r.get("run", {}).get("model") or DEFAULT_MODEL, *(r["meta"].get(k) for k in ("dataset", "split", "start", "count", "target"))) for r in runs}
    if len(same) != 1:
        raise SystemExit(f"{spec}: the runs of one panel must share model, dataset, split, start, count and target: {sorted(map(str, same))}")
    methods: dict = {}
    for r in runs:
        for name, row in r["methods"].items():
            methods.setdefault(name, row)
    return dict(runs[0], methods=methods)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, model=False, quick=f"plot {QUICK_INPUT.relative_to(ROOT)} alone")
    ap.add_argument("out", help="the PNG to write")
    ap.add_argument("runs", nargs="*", metavar="RUN_JSON",
                    help="select_eval.py --run-file outputs, one panel each (a+b: one panel from two runs)")
    args = ap.parse_args(argv)
    if args.quick:
        args.runs = [str(QUICK_INPUT)]
    if not args.runs:
        ap.error("give at least one run file")
    record = RunRecord.start(args)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out, paths = Path(args.out), args.runs
    runs = [panel(path) for path in paths]
    record.model = ", ".join(sorted({r.get("run", {}).get("model") or "smollm2-135m-instruct (before run files)" for r in runs}))
    labels = sorted({family(n)[0] for data in runs for n in data["methods"] if n != "full prefill"})
    hues = [plt.get_cmap("tab20")(i) for i in [*range(0, 20, 2), *range(1, 20, 2)]]  # ten hues, then their light shades
    colours = {label: hues[i % 20] for i, label in enumerate(labels)}  # one colour per method in every panel
    wide = len(paths) > 1
    fig, axes = plt.subplots(2, len(paths), figsize=(max(5.2 * len(paths), 7.5), 8.2 if wide else 9.4), squeeze=False)
    for col, data in enumerate(runs):
        curves: dict[str, list[tuple[float, float, float]]] = {}
        for name, row in data["methods"].items():
            if name == "full prefill" or not row["time"]:
                continue
            label, ratio = family(name)
            curves.setdefault(label, []).append((ratio, 1 / row["time"], row["kl"], row["f1"]))
        for label, points in sorted(curves.items()):
            points.sort()
            style = "o-" if len(points) > 1 else "s"
            for row, key in ((0, 2), (1, 3)):
                axes[row][col].plot([p[1] for p in points], [p[key] for p in points], style, color=colours[label], label=label)
        meta, model = data["meta"], data.get("run", {}).get("model") or "smollm2-135m-instruct"
        axes[0][col].set(title=f"{model}: {meta['dataset']} ({meta['split']} split, {meta['count']} prompts)",
                         ylabel="mean KL vs full prefill (lower is better)")
        axes[0][col].set_ylim(bottom=0)
        axes[1][col].set(xlabel="prefill speedup over full prefill", ylabel="answer F1 vs full prefill")
        axes[1][col].set_ylim(0, 1.02)
    handles = {h.get_label(): h for ax in axes[0] for h in ax.get_lines()}
    fig.legend([handles[label] for label in labels], labels, loc="lower center", ncol=2 if wide else 1, fontsize=8)
    fig.tight_layout(rect=(0, 0.1 if wide else 0.2, 1, 1))
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    record.write(args.run_file, {"out": str(out), "inputs": paths})


if __name__ == "__main__":
    main()
