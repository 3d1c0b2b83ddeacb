"""A real server on a free loopback port (uvicorn in a thread), and what tests read from it."""

import threading
import time
from contextlib import contextmanager

import httpx
import uvicorn

from cacheblend.serving import create_app
from cacheblend.serving.command import bind

TINY = "tiny"


@contextmanager
def running(engine, **options):
    """Serves ``engine`` on 127.0.0.1 at a port it binds itself (as ``cacheblend serve --port 0``);
    yields the base URL (``.../v1``)."""
    app = create_app(engine, **options)
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()




def health(url: str) -> dict:
    return httpx.get(url.removesuffix("/v1") + "/health").json()


def metric(url: str, name: str) -> float:
    """A value from /metrics (the sum over label sets)."""
    text = httpx.get(url.removesuffix("/v1") + "/metrics").text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(f"cacheblend_{name}") and not line.startswith("#")
              and line[len(f"cacheblend_{name}")] in " {"]
    assert values, f"no metric {name}"
    return sum(values)


def wait_for(check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out waiting for the server"
        time.sleep(0.02)
