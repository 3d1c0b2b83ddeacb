"""`cacheblend serve` as a process: defaults, a disk store that persists warmed documents."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from cacheblend.cli import _parser
from cacheblend.serving.command import DEFAULT_STORE


def test_serve_defaults_are_the_bundled_model_on_loopback():
    args = _parser().parse_args(["serve"])
    assert (args.model, args.host, args.port) == ("smollm2-135m-instruct", "127.0.0.1", 8000)
    assert args.store == str(DEFAULT_STORE) and args.func.__name__ == "cmd_serve"


@contextlib.contextmanager
def serve_process(model: str, store: str):
    """`cacheblend serve` in a subprocess on a free loopback port; yields its URL, then stops it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "cacheblend.cli", "serve", "--model", model, "--port", str(port),
           "--store", store, "--served-model-name", "tiny", "--device", "cpu"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=os.environ.copy())
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "the server did not start"
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)  # uvicorn re-raises SIGTERM after a clean shutdown


TEXT = "The ferry across the Tane river is pulled along a steel cable by a diesel winch."


def ask(url: str) -> dict:
    body = {"model": "tiny", "messages": [{"role": "user", "content": TEXT + "\n\nHow is it pulled?"}], "max_tokens": 4}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60).json()["usage"]


def test_serve_process_warms_into_its_disk_store(tiny_model_dir, tmp_path):
    store = tmp_path / "kv"
    with serve_process(tiny_model_dir, str(store)) as url:
        assert httpx.post(url + "/v1/documents", json={"documents": [TEXT]}).json()["warmed"] == 1
        assert list(store.rglob("*.safetensors")), "no KV file written to the store"
        assert ask(url)["cacheblend"]["chunk_hits"] == 1


def test_two_serve_processes_share_one_redis_store(tiny_model_dir, tmp_path):
    """`--store redis://...`: what one replica warms, another (started empty) reuses."""
    from cacheblend.tools.local_redis import RedisServer

    redis = RedisServer(tmp_path / "redis").start()
    try:
        with serve_process(tiny_model_dir, redis.url) as first:
            assert httpx.post(first + "/v1/documents", json={"documents": [TEXT]}).json()["warmed"] == 1
        assert not list(tmp_path.rglob("*.safetensors"))  # nothing went to a disk store
        with serve_process(tiny_model_dir, redis.url) as second:
            assert ask(second)["cacheblend"]["chunk_hits"] == 1
    finally:
        redis.stop()
