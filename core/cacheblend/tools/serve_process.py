"""``cacheblend serve`` in a child process, for tests and benchmarks.

The server binds its own port (``--port 0``) and prints the URL it serves on; ``ServeProcess``
reads that line from the server's log, so no port is chosen here and bound there later (another
process, or an outgoing connection, could take it in between, and a health check could then be
answered by a different server). The output goes to a file, never to a pipe nobody drains.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

_SERVING = re.compile(rb"^serving .* on (http://\S+)/v1 ", re.MULTILINE)


class ServeProcess:
    """``cacheblend serve --port 0 ARGS...`` with its output in ``log_path``.

    ``start()`` launches it; ``wait_ready()`` returns its base URL (``http://127.0.0.1:PORT``) once
    ``/health`` answers, or fails with the log's tail if it exits or takes longer than ``timeout``."""

    def __init__(self, args: list[str], log_path: str | os.PathLike):
        if "--port" in args:
            raise ValueError("ServeProcess serves on the port the server binds itself: leave --port out")
        self.args = [str(a) for a in args]
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None

    def start(self) -> ServeProcess:
        cmd = [sys.executable, "-m", "cacheblend.cli", "serve", "--port", "0", *self.args]
        with open(self.log_path, "wb") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
        return self

    def wait_ready(self, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"cacheblend serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"cacheblend serve was not ready in {timeout:.0f} s:\n{self.log_tail()}")
            if self.url is None:
                found = _SERVING.search(self.log_path.read_bytes())
                self.url = found and found.group(1).decode()
            if self.url is not None:
                try:
                    if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                        return self.url
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)

    def log_tail(self, size: int = 4000) -> str:
        return self.log_path.read_bytes()[-size:].decode(errors="replace")

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then waits; SIGKILL if it has not exited in ``timeout``. Returns its exit code:
        one of ``CLEAN_STOP`` where it shut down cleanly (uvicorn re-raises SIGTERM after a clean
        shutdown), -9 where it had to be killed."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


CLEAN_STOP = (0, -signal.SIGTERM)
