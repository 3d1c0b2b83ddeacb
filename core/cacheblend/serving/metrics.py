"""Server metrics in the Prometheus text format (version 0.0.4), without a client library.

Counters and one histogram, updated from the model thread and the ASGI side under one lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..result import BlendStats

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

_COUNTERS = {
    "chunk_hits_total": "Chunks whose KV was found in a store",
    "chunk_misses_total": "Chunks found in prompts whose KV was not stored",
    "prompt_tokens_reused_total": "Prompt tokens whose cached KV was used as is",
    "prompt_tokens_recomputed_total": "Prompt tokens computed through the last layer",
    "doubt_redos_total": "Prompts prefilled again by the doubt gate (BlendConfig.doubt_margin)",
    "prompt_tokens_redone_total": "Prompt tokens the doubt gate's second prefills computed",
    "completion_tokens_total": "Tokens generated",
    "decode_steps_total": "Batched decode forwards",
    "decode_rows_total": "Sequences advanced by the decode forwards (rows / steps = mean batch size)",
    "decode_seconds_total": "Time in batched decode forwards (rows / seconds = decode tokens per second)",
}


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._requests: dict[tuple[str, int], int] = {}
        self._buckets = [0] * len(TTFT_BUCKETS)
        self._ttft_sum = 0.0
        self._ttft_count = 0
        self._queue = 0

    def request(self, endpoint: str, status: int) -> None:
        with self._lock:
            key = (endpoint, status)
            self._requests[key] = self._requests.get(key, 0) + 1

    def prefilled(self, stats: BlendStats) -> None:
        with self._lock:
            self._counts["chunk_hits_total"] += stats.chunk_hits
            self._counts["chunk_misses_total"] += stats.chunk_misses
            self._counts["prompt_tokens_reused_total"] += stats.reused_tokens
            self._counts["prompt_tokens_recomputed_total"] += stats.recomputed_tokens

    def redone(self, stats: BlendStats) -> None:
        """The doubt gate prefilled a prompt again; ``stats``: that second prefill's."""
        with self._lock:
            self._counts["doubt_redos_total"] += 1
            self._counts["prompt_tokens_redone_total"] += stats.recomputed_tokens

    def first_token(self, seconds: float) -> None:
        with self._lock:
            for i, bound in enumerate(TTFT_BUCKETS):
                if seconds <= bound:
                    self._buckets[i] += 1
            self._ttft_sum += seconds
            self._ttft_count += 1

    def completed(self, stats: BlendStats) -> None:
        with self._lock:
            self._counts["completion_tokens_total"] += stats.completion_tokens

    def decode_step(self, rows: int, seconds: float) -> None:
        with self._lock:
            self._counts["decode_steps_total"] += 1
            self._counts["decode_rows_total"] += rows
            self._counts["decode_seconds_total"] += seconds

    def set_queue(self, depth: int) -> None:
        self._queue = depth

    def render(self, gauges: dict[str, tuple[str, Callable[[], float]]]) -> str:
        """The exposition text; ``gauges`` maps name -> (help, read) for values read at scrape time."""
        out: list[str] = []
        with self._lock:
            out += _header("requests_total", "counter", "HTTP requests by endpoint and status")
            out += [
                f'cacheblend_requests_total{{endpoint="{e}",status="{s}"}} {n}'
                for (e, s), n in sorted(self._requests.items())
            ]
            for name, text in _COUNTERS.items():
                out += _header(name, "counter", text) + [f"cacheblend_{name} {self._counts[name]}"]
            out += _header("time_to_first_token_seconds", "histogram", "From request arrival to the first token")
            for bound, n in zip(TTFT_BUCKETS, self._buckets):
                out.append(f'cacheblend_time_to_first_token_seconds_bucket{{le="{bound}"}} {n}')
            out.append(f'cacheblend_time_to_first_token_seconds_bucket{{le="+Inf"}} {self._ttft_count}')
            out.append(f"cacheblend_time_to_first_token_seconds_sum {self._ttft_sum}")
            out.append(f"cacheblend_time_to_first_token_seconds_count {self._ttft_count}")
            gauges = {"queue_depth": ("Requests waiting for the model thread", lambda: self._queue)} | gauges
        for name, (text, read) in gauges.items():
            out += _header(name, "gauge", text) + [f"cacheblend_{name} {read()}"]
        return "\n".join(out) + "\n"


def _header(name: str, kind: str, text: str) -> list[str]:
    return [f"# HELP cacheblend_{name} {text}", f"# TYPE cacheblend_{name} {kind}"]
