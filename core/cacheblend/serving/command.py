"""``cacheblend serve``: what runs it (its arguments are in cliargs.py, with every other command's)."""

from __future__ import annotations

import socket
from pathlib import Path

from ..cliargs import blend_config


def cmd_serve(args) -> int:
    with bind(args.host, args.port) as sock:  # before the model loads: a taken port fails at once
        _serve(args, sock)
    return 0


def _serve(args, sock: socket.socket) -> None:
    from ..engine import BlendEngine
    from .app import SchedulerLimits, create_app, serve

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from ..stores import is_shared_location

    remote = is_shared_location(args.store)  # a server every replica reads, whatever its scheme
    store = None if args.store.lower() == "none" else args.store if remote else Path(args.store).expanduser()
    engine = BlendEngine.from_pretrained(args.model, device=args.device, config=blend_config(args))
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
    port = sock.getsockname()[1]  # --port 0: the one the system gave; tests read it from this line
    print(f"serving {args.served_model_name or args.model} on http://{_url_host(args.host)}:{port}/v1 "
          f"(KV store: {store or 'memory only'})", flush=True)
    serve(app, host=args.host, port=port, sock=sock)


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (0: a free port the system picks) and listening: binding
    is what reserves the port (choosing a free one first and binding it later lets another process
    take it in between), and a bound socket that is not listening yet does not keep another one with
    SO_REUSEADDR off its port. Connections made while the model loads wait in the backlog."""
    if not 0 <= port <= 65535:
        raise ValueError(f"--port must be 0-65535 (0: any free port), got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: restarts reuse the port
    try:
        sock.bind((host, port))
        sock.listen(2048)  # uvicorn's backlog
    except OSError as exc:
        sock.close()
        raise ValueError(f"cannot serve on {host}:{port}: {exc.strerror} (--port 0 picks a free port)") from exc
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
