"""Warming a corpus on Ray: chunks/s with 1 and 2 workers against one process, and the records equal.

    .venv/bin/python benchmarks/ray_warm.py --run-file docs/runs/ray_warm.json
    .venv/bin/python benchmarks/ray_warm.py --quick --model PATH     # 12 short passages, seconds

Takes ``--passages`` pydoc passages of at most ``--max-tokens`` tokens and warms them (the
default config: behind 1 neighbour, with lead records), each leg into an empty folder:
- one process: ``BlendEngine.warm`` with ``--threads`` torch threads (the reference records);
- Ray, 1 worker and 2 workers of ``--threads`` threads each (``cacheblend.distributed``), on a
  local Ray of ``max(workers) * threads`` CPUs started here on loopback.
Each rate is chunks / the warming seconds (planning and the units; the workers' start and model
load are reported apart, as ``load_s``). Every leg's records are compared with the one-process
records (torch.equal) and the run file says whether all were equal.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from runfile import RunRecord, add_common


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, quick="12 pydoc passages of up to 64 tokens, 1 and 2 workers")
    ap.add_argument("--passages", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128, help="pydoc passages of at most this many tokens")
    ap.add_argument("--workers", default="1,2", help="worker counts to time (comma-separated)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker and for the one-process leg")
    args = ap.parse_args(argv)
    if args.quick:
        args.passages, args.max_tokens = 12, 64
    record = RunRecord.start(args)

    import ray
    import torch

    from cacheblend import BlendConfig, BlendEngine
    from cacheblend.distributed import RayWarmOptions, warm_corpus
    from cacheblend.stores import DiskStore, compact
    from cacheblend.tools.datasets import pydoc_passages

    torch.set_num_threads(args.threads)
    counts = [int(x) for x in args.workers.split(",")]
    config = BlendConfig()
    engine = BlendEngine.from_pretrained(args.model, device="cpu", config=config)
    texts = [p.text for p in pydoc_passages(engine.count_tokens, args.max_tokens)][: args.passages]
    tokens = sum(engine.count_tokens(t) for t in texts)
    work = Path(tempfile.mkdtemp(prefix="ray_warm-"))

    def records(folder: Path) -> dict:
        store = DiskStore(folder, engine.kv.fingerprint, compact.codec_for(config.kv_dtype))
        keys = [p.name.removesuffix(".safetensors") for p in (store.dir / "kv").rglob("*.safetensors")]
        return {k: store.get(k).kv for k in keys}

    t = time.perf_counter()
    engine.warm(texts, store_dir=work / "one", progress=False)
    one_s = time.perf_counter() - t
    want = records(work / "one")
    legs = [{"leg": "one process", "workers": 0, "warm_s": one_s, "load_s": 0.0, "chunks_per_s": len(texts) / one_s,
             "records": len(want), "identical": True}]
    print(f"{len(texts)} passages, {tokens} tokens; one process ({args.threads} thread(s)): {one_s:.1f}s, "
          f"{len(texts) / one_s:.2f} chunks/s")
    ray.init(num_cpus=max(counts) * args.threads, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    try:
        for n in counts:
            folder = work / f"ray{n}"
            options = RayWarmOptions(workers=n, threads=args.threads)
            r = warm_corpus(texts, model=args.model, store=folder, config=config, options=options)
            got = records(folder)
            same = set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
            legs.append({"leg": f"Ray, {n} worker(s)", "workers": n, "warm_s": r.warm_s, "load_s": r.load_s,
                         "chunks_per_s": r.chunks / r.warm_s, "records": r.computed, "per_worker": r.per_worker,
                         "identical": same})
            print(f"Ray {n} worker(s) x {args.threads} thread(s): {r.warm_s:.1f}s (+{r.load_s:.1f}s start), "
                  f"{r.chunks / r.warm_s:.2f} chunks/s, per worker {r.per_worker}, identical to one process: {same}")
    finally:
        ray.shutdown()
    if not all(leg["identical"] for leg in legs):
        raise SystemExit("a Ray leg stored records that differ from the one-process warm")
    if args.run_file:
        record.write(args.run_file, {"passages": len(texts), "tokens": tokens, "max_tokens": args.max_tokens,
                                     "threads": args.threads, "config": {"neighbours": config.neighbours,
                                     "lead_alone": config.lead_alone, "kv_dtype": config.kv_dtype}, "legs": legs})


if __name__ == "__main__":
    main()
