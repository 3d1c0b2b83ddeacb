"""`cacheblend serve` as a process: defaults, a disk store that persists warmed documents."""

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


def test_serve_process_warms_into_its_disk_store(tiny_model_dir, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = tmp_path / "kv"
    cmd = [sys.executable, "-m", "cacheblend.cli", "serve", "--model", tiny_model_dir, "--port", str(port),
           "--store", str(store), "--served-model-name", "tiny", "--device", "cpu"]
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
        text = "The ferry across the Tane river is pulled along a steel cable by a diesel winch."
        assert httpx.post(url + "/v1/documents", json={"documents": [text]}).json()["warmed"] == 1
        assert list(store.rglob("*.safetensors")), "no KV file written to the store"
        body = {"model": "tiny", "messages": [{"role": "user", "content": text + "\n\nHow is it pulled?"}],
                "max_tokens": 4}
        usage = httpx.post(url + "/v1/chat/completions", json=body, timeout=60).json()["usage"]
        assert usage["cacheblend"]["chunk_hits"] == 1
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)  # uvicorn re-raises SIGTERM after a clean shutdown
