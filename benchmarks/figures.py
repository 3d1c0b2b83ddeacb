"""Lists every figure (table with measured numbers, plot) in README.md and docs/*.md -> its run file.

    python benchmarks/figures.py                  # the listing; exit 1 if a marker names a missing file
    python benchmarks/figures.py --strict README.md   # also exit 1 for a figure without a run file

The convention (benchmarks/README.md): a marker ``<!-- run: docs/runs/NAME.json -->`` (several
paths separated by commas) stands before a figure and covers the next table or image and those
that follow it with only blank lines between (a table and its plot); prose or a heading after
them ends it. ``<!-- not measured: why -->`` does the same for a table of settings rather than
results. A table counts as a figure when a body cell holds a measured
number: a decimal (``0.0235``) or a number with a unit (``4.28x``, ``16.7%``, ``0.45 s``, ``12 ms``).
A ``docs/NAME.md`` table is covered by ``docs/NAME.json`` when that file exists (``cacheblend
bench`` and ``bench_serve.py`` write the two together). A run file without the command that
made it (a ``run`` entry, or ``command`` at the top level; written before benchmarks/runfile.py
existed) is listed as ``legacy``: it holds the results
but not the command, commit and machine load.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!--\s*run:\s*(.+?)\s*-->")
NOT_MEASURED = re.compile(r"<!--\s*(not measured:\s*.+?)\s*-->")  # a table of settings, not of results
FIGURE = re.compile(
    r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?\s?(?:x|%|s|ms|KL|tok/s|tokens/s|MiB|MB|GiB|GB)(?![\w/])"
    r"|(?<![\w.])\d+\.\d+(?![\w.])"
)
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)]+\.(?:png|svg|jpg))\)")


@dataclass
class Figure:
    doc: Path
    line: int  # 1-based
    kind: str  # "table" or "image"
    title: str
    runs: list[str] = field(default_factory=list)


def _body_has_figure(rows: list[str]) -> bool:
    """Whether a table's body (rows after the header and separator) holds a measured number."""
    return any(FIGURE.search(re.sub(r"`[^`]*`", "", row)) for row in rows[2:])


def scan(doc: Path) -> tuple[list[Figure], list[tuple[int, str]]]:
    """The figures of one markdown file with the run files that cover them, and its markers."""
    lines = doc.read_text().splitlines()
    sibling = doc.with_suffix(".json")
    implicit = [str(sibling.relative_to(ROOT))] if sibling.exists() and doc.parent.name == "docs" else []
    figures, markers, current, i = [], [], list(implicit), 0
    covered = False  # the last non-blank line belonged to a figure the marker covers
    while i < len(lines):
        line = lines[i]
        if m := MARKER.search(line):
            current = [p.strip() for p in m.group(1).split(",") if p.strip()]
            markers += [(i + 1, p) for p in current]
        elif m := NOT_MEASURED.search(line):
            current = [m.group(1)]
        elif line.lstrip().startswith("|"):
            start = i
            while i + 1 < len(lines) and lines[i + 1].lstrip().startswith("|"):
                i += 1
            rows = [r.strip() for r in lines[start : i + 1]]
            if _body_has_figure(rows):
                figures.append(Figure(doc, start + 1, "table", rows[0][:70], list(current)))
            covered = True
        elif m := IMAGE.search(line):
            figures.append(Figure(doc, i + 1, "image", m.group(1), list(current)))
            covered = True
        elif line.startswith("#") or (line.strip() and covered):  # prose after its figure ends a marker
            current, covered = list(implicit), False
        i += 1
    return figures, markers


def run_state(path: str) -> str:
    """``ok``, ``legacy`` (results without run metadata) or ``MISSING`` / ``UNREADABLE``."""
    if path.startswith("not measured:"):
        return "no run file needed"
    file = ROOT / path
    if not file.is_file():
        return "MISSING"
    if file.suffix != ".json":
        return "ok"
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return "UNREADABLE"
    if not isinstance(data, dict):
        return "legacy"
    # benchmarks/ scripts write a "run" entry, `cacheblend bench` a "meta" one, `cacheblend demo` the top level
    meta = next((data[k] for k in ("run", "meta") if isinstance(data.get(k), dict)), data)
    return "ok" if "command" in meta else "legacy"


def documents(names: list[str]) -> list[Path]:
    if names:
        return [(ROOT / n).resolve() for n in names]
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("docs", nargs="*", help="markdown files (default README.md and docs/*.md)")
    ap.add_argument("--strict", action="store_true", help="also fail when a figure has no run file")
    ap.add_argument("--quick", action="store_true", help="the same listing (it takes well under a second)")
    args = ap.parse_args(argv)
    bad = unmarked = 0
    for doc in documents(args.docs):
        if not doc.is_file():
            print(f"{doc}: no such file")
            bad += 1
            continue
        figures, markers = scan(doc)
        name = doc.relative_to(ROOT) if doc.is_relative_to(ROOT) else doc
        for line, path in markers:
            if (state := run_state(path)) in ("MISSING", "UNREADABLE"):
                print(f"{name}:{line}: marker names {path}: {state}")
                bad += 1
        for fig in figures:
            runs = ", ".join(f"{p} ({run_state(p)})" for p in fig.runs) or "NO RUN FILE"
            unmarked += not fig.runs
            print(f"{name}:{fig.line}: {fig.kind} {fig.title!r} -> {runs}")
    print(f"\n{bad} marker(s) naming a missing file; {unmarked} figure(s) without a run file")
    return 1 if bad or (args.strict and unmarked) else 0


if __name__ == "__main__":
    sys.exit(main())
