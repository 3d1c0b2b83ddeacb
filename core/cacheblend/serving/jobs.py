"""What the ASGI side and the model thread exchange: a ``Job`` in, its ``Event``s out, and
``QueueFull`` when the scheduler's queue has no room (``serving/scheduler.py``)."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from ..generation.decode import Sampling
from ..result import BlendStats


class QueueFull(Exception):
    """The scheduler's queue is full; the request should be retried later."""


@dataclass
class Event:
    """kind: 'start' (prompt stats), 'text' (a piece), 'done' (final stats) or 'error'."""

    kind: str
    text: str = ""
    stats: BlendStats | None = None
    error: Exception | None = None


@dataclass
class Job:
    """One generation request as the model thread sees it."""

    prompt: str
    max_tokens: int | None
    sampling: Sampling
    stop: list[str]
    recompute_ratio: float | str | None = None  # "auto": the adaptive budget
    documents: list[str] = field(default_factory=list)  # looked for in the prompt (warmed on miss, or first)
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)
    events: asyncio.Queue | None = None
    loop: asyncio.AbstractEventLoop | None = None

    def emit(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.cancelled.set()
