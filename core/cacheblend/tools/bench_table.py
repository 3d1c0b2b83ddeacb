"""``cacheblend bench``'s outputs: the markdown table, the plot and the files (``bench.py`` measures).

The table's columns are the summary rows' (``bench.MethodResult.summary``; the module docstring
of ``bench.py`` says what each measures); a blended row's KL is also given as a share of both
full reuses' KL.
"""

from __future__ import annotations

import json
from pathlib import Path

from .bench import REUSE_ALONE, row


def markdown(rows: list[dict], title: str) -> str:
    """The table; a blended row's KL is also given as a share of full reuse's, of the method's
    own records ("full reuse") and, where the table has it, of chunks warmed alone."""
    gold = any(r["f1_vs_gold"] is not None for r in rows)
    alone = next((r for r in rows if r["method"] == REUSE_ALONE), None)
    own = row(rows, "full reuse")
    head = ("| method | recomputed | TTFT (s) | speedup | floor | MAC floor | of floor, per prompt: rows; MACs "
            "| KV load (s) | KL vs full | KL / full reuse" + (": own records; alone" if alone else "")
            + " | answer F1 vs full |")
    lines = [f"**{title}**", "", head + (" F1 vs gold |" if gold else ""), "|" + "---|" * (11 + gold)]
    for r in rows:
        ratios = "" if r["method"] in ("full prefill", "prefix caching") else _share(r["kl"], own["kl"]) + (f"; {_share(r['kl'], alone['kl'])}" if alone else "")
        line = (
            f"| {r['method']} | {r['recomputed_share']:.1%} | {r['ttft_s']:.3f} | {r['speedup']:.2f}x | {r['floor']:.2f}x "
            f"| {r['mac_floor']:.2f}x | {r['of_floor']:.2f}; {r['of_mac_floor']:.2f} "
            f"| {r['load_s']:.3f} | {r['kl']:.4f} | {ratios} | {r['f1_vs_full']:.3f} |"
        )
        lines.append(line + (f" {r['f1_vs_gold']:.3f} |" if gold else ""))
    return "\n".join(lines)


def _share(kl: float, reference: float) -> str:
    return f"{kl / reference:.2f}x" if reference > 0 else "-"


def plot(rows: list[dict], path: Path, title: str) -> None:
    """TTFT and quality against the recompute share, with the baselines marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    blend = [r for r in rows if r["method"].startswith("cacheblend") or r["method"] == "full reuse"]
    blend.sort(key=lambda r: r["recomputed_share"])
    xs = [100 * r["recomputed_share"] for r in blend]
    ax1.plot(xs, [r["ttft_s"] for r in blend], "o-", label="cacheblend (full reuse at left)")
    for r, style in ((row(rows, "full prefill"), "r--"), (row(rows, "prefix caching"), "k:")):
        ax1.axhline(r["ttft_s"], linestyle=style[1:], color=style[0], label=r["method"])
    others = [r for r in rows if r not in blend and r["method"] not in ("full prefill", "prefix caching")]
    for r in others:  # the baselines of another warming (CacheBlend alone, EPIC): single points
        ax1.plot(100 * r["recomputed_share"], r["ttft_s"], "^", label=r["method"])
    ax1.set(xlabel="tokens recomputed (% of prompt)", ylabel="median TTFT (s)", title="Time to first token")
    ax1.set_ylim(bottom=0)
    ax1.legend()
    ax2.plot(xs, [r["kl"] for r in blend], "o-", label="KL vs full prefill")
    for r in others:
        ax2.plot(100 * r["recomputed_share"], r["kl"], "^", label=f"KL, {r['method']}")
    ax2.set(xlabel="tokens recomputed (% of prompt)", ylabel="mean KL", title="Quality")
    ax3 = ax2.twinx()
    ax3.plot(xs, [r["f1_vs_full"] for r in blend], "s--", color="tab:green", label="answer F1 vs full")
    ax3.set_ylabel("answer F1 vs full prefill")
    ax3.set_ylim(0, 1.05)
    ax2.legend(loc="center right")
    ax3.legend(loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def save(rows: list[dict], out_dir: Path, title: str, meta: dict) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    md = markdown(rows, title)
    (out_dir / "bench.md").write_text(md + "\n")
    (out_dir / "bench.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    plot(rows, out_dir / "bench.png", title)
    return md
