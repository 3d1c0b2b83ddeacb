"""A/B of the blended prefill against the code at a git ref, interleaved in one process.

    .venv/bin/python benchmarks/blend_ab.py --ref integration --prompts 2 --repeats 5
    .venv/bin/python benchmarks/blend_ab.py --quick     # HEAD against the working tree, 1 short prompt

Loads ``blending/blend.py`` and ``models/adapter.py`` as they are at ``--ref`` next to the
working tree's, then times ``engine.prefill`` on pydoc prompts (``--chunks`` x ~512 tokens, chunk KV in the
memory tier) alternating the two, plus full prefill. Prints median TTFT per side and the
new/old ratio (also as the median of the back-to-back pairs' ratios, less sensitive to load
changes): on shared CPUs only ratios within one run mean anything. It also prints, per prompt, the
largest difference between the two sides' logits and KV (0.0: bit-identical outputs).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import statistics
import subprocess
import sys
import time
from pathlib import Path

import cacheblend.prefilling as prefill_mod  # where the request path calls blend_prefill
from cacheblend import BlendEngine
from cacheblend.tools.datasets import pydoc_passages, pydoc_workload
from runfile import RunRecord, add_common

ROOT = Path(__file__).resolve().parents[1]


def load_at(ref: str, path: str, name: str, package: str, siblings: tuple[str, ...] = ()):
    """The module at ``path`` as of git ``ref``, importable with its relative imports. The modules
    named in ``siblings`` (same folder) are imported as they are at ``ref`` where they exist there,
    so that the old module runs against the helpers it was written for."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:{path}"], check=True, capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = package
    sys.modules[name] = module  # dataclasses look their module up
    saved = {}
    for sibling in siblings:
        sib_path = str(Path(path).parent / f"{sibling}.py")
        exists = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{ref}:{sib_path}"], capture_output=True)
        if exists.returncode == 0:
            full = f"{package}.{sibling}"
            saved[full] = sys.modules.get(full)
            sys.modules[full] = load_at(ref, sib_path, f"{name}_{sibling}", package)
    try:
        exec(compile(source, f"{ref}:{path}", "exec"), module.__dict__)
    finally:
        for full, previous in saved.items():
            if previous is None:
                sys.modules.pop(full)
            else:
                sys.modules[full] = previous
    return module


def _as_today(blend):
    """An older ref's ``blend_prefill``, called as today's: a ref from before ``spread`` existed
    takes the request path's ``spread=0.0`` (the only value it can honour)."""
    if "spread" in inspect.signature(blend).parameters:
        return blend

    def call(*args, spread=0.0, **kwargs):
        if spread:
            raise SystemExit("the old ref's blend has no spread: compare at spread 0")
        return blend(*args, **kwargs)

    return call


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, quick="--ref HEAD, 1 prompt of 2 passages of up to 96 tokens, 1 repeat")
    ap.add_argument("--ref", default="integration", help="the git ref of the old side")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ratio", type=float, default=0.15)
    ap.add_argument("--chunks", type=int, default=6)
    ap.add_argument("--chunk-tokens", type=int, default=512, help="pydoc passages of at most this, at least 3/4 of it")
    ap.add_argument("--old-clone", action="store_true", help="old side: the cache clone of refs before 9c02532")
    args = ap.parse_args(argv)
    if args.quick:
        args.ref, args.prompts, args.repeats, args.chunks, args.chunk_tokens = "HEAD", 1, 1, 2, 96
    record = RunRecord.start(args)
    engine = BlendEngine.from_pretrained(args.model)
    blend_path = "core/cacheblend/blending/blend.py"
    old_blend = load_at(args.ref, blend_path, "ab_old_blend", "cacheblend.blending", ("feed", "rope", "rows"))
    old_adapter = load_at(args.ref, "core/cacheblend/models/adapter.py", "ab_old_adapter", "cacheblend.models")
    sides = {
        "new": (engine.adapter, prefill_mod.blend_prefill),
        "old": (old_adapter.adapt(engine.adapter.model), _as_today(old_blend.blend_prefill)),
    }
    lo = args.chunk_tokens * 3 // 4
    passages = [p for p in pydoc_passages(engine.count_tokens, args.chunk_tokens) if engine.count_tokens(p.text) >= lo]
    examples = pydoc_workload(passages, args.prompts, args.chunks)
    engine.warm(sorted({p for ex in examples for p in ex.passages}))
    times: dict[str, list[float]] = {"new": [], "old": [], "full": []}
    diffs = []
    for ex in examples:
        req = dict(chunks=ex.passages, query=ex.question)
        outputs = []
        for _ in range(args.repeats):
            for side, (adapter, blend) in sides.items():
                engine.prefiller.adapter, prefill_mod.blend_prefill = adapter, blend
                t = time.perf_counter()
                pre = engine.prefill(**req, recompute_ratio=args.ratio)
                if side == "old" and args.old_clone:  # Prefilled.cache() before 9c02532: a clone, then a copy
                    adapter.make_cache([(k.clone(), v.clone()) for k, v in pre.output.kv])
                else:
                    pre.cache()  # what a caller needs before the first token
                times[side].append(time.perf_counter() - t)
                if len(outputs) < 2:  # the first repeat's new and old outputs, compared below
                    outputs.append(pre.output)
            engine.prefiller.adapter, prefill_mod.blend_prefill = sides["new"]
            times["full"].append(engine.prefill(**req, recompute_ratio=1.0).stats.ttft_s)
        diffs.append(_max_diff(*outputs[:2]))
        print(f"{len(ex.passages)} chunks: new vs old max |diff| {diffs[-1]:.3g} (logits and KV)")
    med = {k: statistics.median(v) for k, v in times.items()}
    pairs = statistics.median(a / b for a, b in zip(times["new"], times["old"]))
    print(f"ratio {args.ratio}: new {med['new']:.3f}s, old ({args.ref}) {med['old']:.3f}s, "
          f"new/old {med['new'] / med['old']:.3f} (median of pairs {pairs:.3f})")
    print(f"speedup vs full prefill ({med['full']:.3f}s): new {med['full'] / med['new']:.2f}x, old {med['full'] / med['old']:.2f}x")
    record.write(args.run_file, {"median_s": med, "new_over_old_pairs": pairs, "max_diff": diffs, "times": times})


def _max_diff(a, b) -> float:
    """The largest absolute difference between two BlendOutputs' logits and per-layer K/V."""
    diffs = [(a.logits - b.logits).abs().max()]
    diffs += [(x - y).abs().max() for ka, kb in zip(a.kv, b.kv) for x, y in zip(ka, kb)]
    return float(max(diffs))


if __name__ == "__main__":
    main()
