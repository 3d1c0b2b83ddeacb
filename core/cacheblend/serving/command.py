"""``cacheblend serve``: its arguments and its entry point (kept here so cli.py stays small)."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_STORE = Path("~/.cache/cacheblend/serve-store")


def add_serve_parser(sub) -> None:
    s = sub.add_parser("serve", help="an OpenAI-compatible server with blending and continuous batching")
    from ..cli import model_arg, neighbours_arg

    model_arg(s)
    s.add_argument("--device", default="auto")
    s.add_argument("--store", default=str(DEFAULT_STORE),
                   help=f"KV store: a directory (disk), a Redis URL (redis://host:port/db, shared by every "
                        f"replica attached to it), or 'none' for memory only (default {DEFAULT_STORE})")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", default=os.environ.get("CACHEBLEND_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 routes (default $CACHEBLEND_API_KEY)")
    s.add_argument("--served-model-name", default=None, help="the model name clients send (default: --model)")
    s.add_argument("--max-batch", type=int, default=8, help="sequences decoded together")
    s.add_argument("--max-queue", type=int, default=64, help="waiting requests before 429")
    s.add_argument("--max-prefill-tokens", type=int, default=4096,
                   help="tokens the prefills between two decode steps may compute (at least one request "
                        "is admitted); waiting requests are admitted until it is spent (default 4096)")
    s.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    neighbours_arg(s)
    s.set_defaults(func=cmd_serve)


def cmd_serve(args) -> int:
    from ..engine import BlendEngine
    from .app import create_app, serve

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from ..stores.redis import is_redis_url

    remote = is_redis_url(args.store)
    store = None if args.store.lower() == "none" else args.store if remote else Path(args.store).expanduser()
    from ..config import BlendConfig

    config = BlendConfig(neighbours=args.neighbours)
    engine = BlendEngine.from_pretrained(args.model, device=args.device, store_dir=store, config=config)
    app = create_app(
        engine,
        store_dir=None if remote else store,  # warm() writes through to every attached Redis store
        api_key=args.api_key or None,
        model_names=[args.served_model_name or args.model],
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        max_prefill_tokens=args.max_prefill_tokens,
    )
    print(f"serving {args.served_model_name or args.model} on http://{args.host}:{args.port}/v1 "
          f"(KV store: {store or 'memory only'})", flush=True)
    serve(app, host=args.host, port=args.port)
    return 0
