"""``cacheblend serve``: what runs it (its arguments are in cliargs.py, with every other command's)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_STORE = Path("~/.cache/cacheblend/serve-store")  # --store's default


def cmd_serve(args) -> int:
    from ..engine import BlendEngine
    from .app import SchedulerLimits, create_app, serve

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from ..stores import is_shared_location

    remote = is_shared_location(args.store)  # a server every replica reads, whatever its scheme
    store = None if args.store.lower() == "none" else args.store if remote else Path(args.store).expanduser()
    from ..config import BlendConfig

    config = BlendConfig.for_model(args.model, neighbours=args.neighbours, doubt_margin=args.doubt_margin)
    engine = BlendEngine.from_pretrained(args.model, device=args.device, config=config)
    if store is not None:
        budget = int(args.store_max_gib * 2**30) if args.store_max_gib else None
        if budget is not None and remote:
            raise ValueError("--store-max-gib bounds a folder store; a Redis server bounds itself (maxmemory, "
                             "maxmemory-policy allkeys-lfu)")
        engine.attach_store(store, max_bytes=budget)
    app = create_app(
        engine,
        store_dir=None if remote else store,  # warm() writes through to every attached shared tier
        api_key=args.api_key or None,
        model_names=[args.served_model_name or args.model],
        limits=SchedulerLimits(
            max_batch=args.max_batch, max_queue=args.max_queue, max_prefill_tokens=args.max_prefill_tokens,
            warm_on_miss=args.warm_on_miss,
        ),
    )
    print(f"serving {args.served_model_name or args.model} on http://{args.host}:{args.port}/v1 "
          f"(KV store: {store or 'memory only'})", flush=True)
    serve(app, host=args.host, port=args.port)
    return 0
