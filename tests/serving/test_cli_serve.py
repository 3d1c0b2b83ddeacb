"""`cacheblend serve` as a process: defaults, a disk store that persists warmed documents, two
replicas running at once on one store (Redis or a disk folder)."""

import contextlib
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from cacheblend.cli import _parser
from cacheblend.cliargs import DEFAULT_STORE
from cacheblend.serving.command import bind
from cacheblend.tools.serve_process import CLEAN_STOP, ServeProcess


def test_serve_defaults_are_the_bundled_model_on_loopback():
    args = _parser().parse_args(["serve"])
    assert (args.model, args.host, args.port) == ("smollm2-135m-instruct", "127.0.0.1", 8000)
    assert args.store == str(DEFAULT_STORE) and args.func.__name__ == "cmd_serve"


@pytest.mark.parametrize("port", ["taken", "-1", "65536"])
def test_serve_on_a_port_it_cannot_bind_fails_before_loading_the_model(port):
    """A taken or impossible --port is a clear error (exit 2) before the model loads: the model named
    here does not exist, and its error would be another one."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = port == "taken"
        port = str(other.getsockname()[1]) if taken else port
        cmd = [sys.executable, "-m", "cacheblend.cli", "serve", "--port", port, "--store", "none",
               "--model", "no-such-model-anywhere"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    expected = f"cannot serve on 127.0.0.1:{port}" if taken else "--port must be 0-65535"
    assert expected in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_bind_reserves_the_port_it_reports():
    """``bind(host, 0)`` holds the port the system gave it from then on (nothing else can bind it
    while the server loads), and two binds never share one."""
    with bind("127.0.0.1", 0) as first, bind("127.0.0.1", 0) as second:
        ports = first.getsockname()[1], second.getsockname()[1]
        assert ports[0] != ports[1] and min(ports) > 0
        with pytest.raises(ValueError, match=f"cannot serve on 127.0.0.1:{ports[0]}"):
            bind("127.0.0.1", ports[0])


@contextlib.contextmanager
def serve_processes(model: str, store: str, logs: Path, n: int = 1, extra=(), while_starting=None):
    """``n`` `cacheblend serve` processes on one store (their other arguments ``extra``), started
    together and all running at once (each binds its own free port), their output in ``logs``;
    ``while_starting()`` runs in this process while they load. Yields their URLs, then stops them."""
    servers = []
    try:
        for i in range(n):
            args = ["--model", model, "--store", store, "--served-model-name", "tiny", "--device", "cpu", *extra]
            servers.append(ServeProcess(args, logs / f"serve{i}.log").start())
        if while_starting is not None:
            while_starting()
        yield [server.wait_ready() for server in servers]
    finally:
        codes = [server.stop() for server in servers]
    for server, code in zip(servers, codes):  # reached when nothing failed before
        assert code in CLEAN_STOP, f"{server.log_path.name} did not stop cleanly ({code}):\n{server.log_tail()}"


@contextlib.contextmanager
def serve_process(model: str, store: str, logs: Path):
    """One `cacheblend serve` process; yields its URL, then stops it."""
    with serve_processes(model, store, logs) as (url,):
        yield url


TEXT = "The ferry across the Tane river is pulled along a steel cable by a diesel winch."


def ask(url: str) -> dict:
    body = {"model": "tiny", "messages": [{"role": "user", "content": TEXT + "\n\nHow is it pulled?"}], "max_tokens": 4}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60).json()["usage"]


def test_serve_process_warms_into_its_disk_store(tiny_model_dir, tmp_path):
    store = tmp_path / "kv"
    with serve_process(tiny_model_dir, str(store), tmp_path) as url:
        assert httpx.post(url + "/v1/documents", json={"documents": [TEXT]}).json()["warmed"] == 1
        assert list(store.rglob("*.safetensors")), "no KV file written to the store"
        assert ask(url)["cacheblend"]["chunk_hits"] == 1


def test_serve_runs_the_selector_it_is_given(tiny_model_dir, tmp_path):
    """``--selector draft``: the server's blends draft an answer first (a first stage, a draft margin in
    every response's usage); the tiny model's default (deviation, as for every model the catalogue
    does not name) runs none."""
    for extra, drafted in (((), False), (("--selector", "draft"), True)):
        logs = tmp_path / ("draft" if drafted else "default")
        logs.mkdir()
        with serve_processes(tiny_model_dir, "none", logs, extra=extra) as (url,):
            assert httpx.post(url + "/v1/documents", json={"documents": [TEXT]}).json()["warmed"] == 1
            usage = ask(url)
        ours = usage["cacheblend"]
        assert ours["chunk_hits"] == 1 and usage["prompt_tokens_details"]["cached_tokens"] > 0
        assert (ours["first_stage_tokens"] > 0, ours["draft_margin"] is not None) == (drafted, drafted), usage


DOCS = [
    "The ferry across the Tane river is pulled along a steel cable by a diesel winch.",
    "In winter the ferry stops at dusk, and the last crossing leaves the north bank at four.",
    "Tickets are sold on board; cyclists pay half fare and dogs travel free of charge.",
]
QUESTIONS = ["How is it pulled?", "When is the last crossing?", "Who travels free?", "What do cyclists pay?"]


def _chat(url: str, q: int) -> tuple[dict, float, float]:
    """A temperature-0 chat over two of DOCS; (response body, start, end on the monotonic clock)."""
    docs = "\n\n".join(DOCS[i % len(DOCS)] for i in (q, q + 1))
    body = {"model": "tiny", "messages": [{"role": "user", "content": f"{docs}\n\n{QUESTIONS[q % 4]}"}],
            "max_tokens": 6, "temperature": 0}
    start = time.monotonic()
    out = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
    assert out.status_code == 200, out.text
    return out.json(), start, time.monotonic()


def _redis_store(tmp_path, stack):
    from cacheblend.tools.local_redis import RedisServer

    redis = RedisServer(tmp_path / "redis").start()
    stack.callback(redis.stop)
    return redis.url


@pytest.mark.parametrize("kind", ["redis", "disk"])
def test_two_serve_processes_running_at_once_share_one_store(tiny_model_dir, tmp_path, kind):
    """Two replicas on one store (a Redis server on loopback, or one disk folder) at the same time:
    what the first warms, the second (started empty, before the warming) reads instead of computing,
    while both answer interleaved requests from threads, at temperature 0 with the same answers."""
    with contextlib.ExitStack() as stack:
        store = _redis_store(tmp_path, stack) if kind == "redis" else str(tmp_path / "kv")
        first, second = stack.enter_context(serve_processes(tiny_model_dir, store, tmp_path, n=2))
        assert httpx.post(first + "/v1/documents", json={"documents": DOCS}).json()["warmed"] == len(DOCS)
        assert bool(list(tmp_path.rglob("*.safetensors"))) is (kind == "disk")  # Redis: nothing on disk
        # the second replica finds every record the first wrote: stored already, nothing warmed
        read = httpx.post(second + "/v1/documents", json={"documents": DOCS}).json()
        assert read["warmed"] == 0 and all(d["cached"] for d in read["data"])

        jobs = [(url, q) for q in range(2 * len(QUESTIONS)) for url in (first, second)]  # interleaved
        with ThreadPoolExecutor(len(jobs)) as pool:
            results = list(pool.map(lambda job: _chat(*job), jobs))
        answers = {url: {} for url in (first, second)}
        for (url, q), (body, _, _) in zip(jobs, results):
            answers[url][q] = body["choices"][0]["message"]["content"]
            usage = body["usage"]
            assert usage["cacheblend"]["chunk_hits"] == 2 and usage["cacheblend"]["chunk_misses"] == 0, usage
            assert usage["prompt_tokens_details"]["cached_tokens"] > 0
        assert answers[second] == answers[first]
        assert len(set(answers[first].values())) > 1  # the answers depend on the prompt
        spans = {url: [(a, b) for (u, _), (_, a, b) in zip(jobs, results) if u == url] for url in (first, second)}
        assert any(a1 < b2 and a2 < b1 for a1, b1 in spans[first] for a2, b2 in spans[second]), \
            "no request to one replica overlapped a request to the other"

        # and the answers equal those of one replica asked one request at a time
        alone = {q: _chat(first, q)[0]["choices"][0]["message"]["content"] for q in answers[first]}
        assert alone == answers[first]
