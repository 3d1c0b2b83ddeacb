"""End-to-end A/B of two checkouts: the records warming writes and the blended prefill's outputs.

    .venv/bin/python benchmarks/ab_checkout.py --ref 68ffc49 --run-file docs/runs/ab_checkout.json
    .venv/bin/python benchmarks/ab_checkout.py --quick     # HEAD against the working tree, 1 prompt of 2 short chunks

A refactor that claims "behaviour unchanged" has to leave both of these bit for bit as they were:
what ``warm`` stores (every record of a disk store: the same keys, header fields and tensor bytes) and what
``prefill`` returns (logits and every layer's K/V at the default ratio and at full prefill). Each
side runs in its own interpreter from its own source tree (``git worktree`` at ``--ref``; the
working tree for the new side) through the public API both sides share
(``BlendEngine.from_pretrained``, ``warm(texts, store_dir=)``, ``prefill(chunks=, query=,
recompute_ratio=)``), on the same pydoc prompts with the default ``BlendConfig``. Prints the
number of records on each side, how many differ, and the largest |difference| of the outputs.
Unlike ``blend_ab.py`` (the blend loop at a ref inside one process, timed), this covers the whole
path: tokenization, warming with neighbours and lead records, stores, assembly, blending.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from runfile import ROOT, RunRecord, add_common

CHILD = r"""
import json, sys, torch
from cacheblend import BlendEngine
from cacheblend.tools.datasets import pydoc_passages, pydoc_workload
args = json.loads(sys.argv[1])
torch.set_num_threads(args["threads"])
engine = BlendEngine.from_pretrained(args["model"])
lo = args["chunk_tokens"] * 3 // 4
passages = [p for p in pydoc_passages(engine.count_tokens, args["chunk_tokens"]) if engine.count_tokens(p.text) >= lo]
examples = pydoc_workload(passages, args["prompts"], args["chunks"])
engine.warm(sorted({p for ex in examples for p in ex.passages}), store_dir=args["store"], progress=False)
out = []
for ex in examples:
    for ratio in (args["ratio"], 1.0):
        pre = engine.prefill(chunks=ex.passages, query=ex.question, recompute_ratio=ratio)
        answer = engine.generate_from(pre, max_new_tokens=args["answer_tokens"]).token_ids  # greedy
        out.append({"ratio": ratio, "logits": pre.output.logits.cpu(), "kv": [(k.cpu(), v.cpu()) for k, v in pre.output.kv],
                    "recomputed": pre.stats.recomputed_tokens, "cached": getattr(pre.stats, "hit_tokens", None) or getattr(pre.stats, "cached_tokens", 0), "answer": answer})
torch.save(out, args["out"])
"""


def run_side(source: Path, args: argparse.Namespace, work: Path, name: str) -> tuple[dict[str, str], Path]:
    """Runs the child in ``source``'s tree; returns {record path: sha256} of its store and its outputs file."""
    store, out = work / f"{name}-store", work / f"{name}.pt"
    spec = {"model": args.model, "chunk_tokens": args.chunk_tokens, "prompts": args.prompts, "chunks": args.chunks,
            "ratio": args.ratio, "threads": args.threads, "store": str(store), "out": str(out),
            "answer_tokens": args.answer_tokens}
    env = dict(os.environ, PYTHONPATH=f"{source / 'core'}{os.pathsep}{source}", HF_HUB_OFFLINE="1")
    subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], check=True, env=env, cwd=source)
    records = {str(p.relative_to(store)): record_digest(p.read_bytes())
               for p in sorted(store.rglob("*.safetensors")) if "quarantine" not in p.parts}
    return records, out


def record_digest(data: bytes) -> str:
    """sha256 of a record's header fields (sorted: safetensors writes its metadata map in no fixed
    order, so two writes of the same record differ in bytes) and of each tensor's bytes by name."""
    from safetensors.torch import load

    n = int.from_bytes(data[:8], "little")
    h = hashlib.sha256(json.dumps(json.loads(data[8 : 8 + n]), sort_keys=True).encode())
    for name, tensor in sorted(load(data).items()):
        h.update(name.encode())
        h.update(tensor.contiguous().view(-1).view(torch_uint8()).numpy().tobytes())
    return h.hexdigest()


def torch_uint8():
    import torch

    return torch.uint8


def max_diff(a: list[dict], b: list[dict]) -> tuple[float, bool]:
    """The largest |difference| of logits and K/V over every output, and whether the stats agree."""
    import torch

    worst, same_stats = 0.0, len(a) == len(b)
    for x, y in zip(a, b):
        diffs = [(x["logits"] - y["logits"]).abs().max()]
        diffs += [(p - q).abs().max() for kx, ky in zip(x["kv"], y["kv"]) for p, q in zip(kx, ky)]
        worst = max(worst, float(torch.stack([d.float() for d in diffs]).max()))
        same_stats &= (x["recomputed"], x["cached"]) == (y["recomputed"], y["cached"])
        same_stats &= x.get("answer") == y.get("answer")  # the greedy answer decoded from the prefill
    return worst, same_stats


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, quick="--ref HEAD, 1 prompt of 2 pydoc passages of up to 96 tokens")
    ap.add_argument("--ref", default="HEAD", help="the git ref of the old side (the new side is the working tree)")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--chunk-tokens", type=int, default=256, help="pydoc passages of at most this, at least 3/4 of it")
    ap.add_argument("--ratio", type=float, default=0.15)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each side (the same on both)")
    ap.add_argument("--answer-tokens", type=int, default=32, help="greedy tokens decoded from each prefill")
    args = ap.parse_args(argv)
    if args.quick:
        args.ref, args.prompts, args.chunks, args.chunk_tokens = "HEAD", 1, 2, 96
    record = RunRecord.start(args)
    import torch

    with tempfile.TemporaryDirectory(prefix="ab-checkout-") as tmp:
        work = Path(tmp)
        old_tree = work / "old-tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(old_tree), args.ref], check=True)
        try:
            old_records, old_out = run_side(old_tree, args, work, "old")
            new_records, new_out = run_side(ROOT, args, work, "new")
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old_tree)], check=False)
        differing = sorted(k for k in old_records.keys() | new_records.keys() if old_records.get(k) != new_records.get(k))
        diff, same_stats = max_diff(torch.load(old_out), torch.load(new_out))
    result = {"ref": args.ref, "records_old": len(old_records), "records_new": len(new_records),
              "records_differing": len(differing), "differing": differing[:20], "max_abs_diff": diff,
              "same_stats": same_stats}
    print(f"records: {len(old_records)} at {args.ref}, {len(new_records)} in the working tree, {len(differing)} differ")
    print(f"prefill outputs (ratio {args.ratio} and 1.0, {args.prompts} prompt(s)): max |diff| {diff:.3g}; "
          f"stats and greedy answers {'equal' if same_stats else 'DIFFER'}")
    record.write(args.run_file, result)
    if differing or diff != 0.0 or not same_stats:
        sys.exit(1)


if __name__ == "__main__":
    main()
