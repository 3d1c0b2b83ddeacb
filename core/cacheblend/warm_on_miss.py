"""Warm on miss: chunks a prefill found in no tier are warmed later, off the request's path.

A prefill that misses a chunk answers as it would anyway (the chunk's tokens are computed inside
the prompt, like every uncached token) and hands the chunk's text to a ``MissQueue``: bounded,
deduplicated, oldest first. A text offered while the queue is full is dropped and counted (the
next miss offers it again). Who drains the queue decides when the work runs:

- the library: a ``BackgroundWarmer`` thread starts a chunk only once no prefill or decode has
  been in flight for ``idle_s`` (``IdleClock``), and gives way between layers: when one starts,
  the warm waits after the layer it is in (a few ms) until the engine is idle again, then goes
  on where it stopped. A request never waits for a warm (the store lock is held only to read and
  write records, never for compute);
- the server: its model thread, between rounds, when no request waits or decodes
  (``serving/scheduler.py``); a request that arrives during the warm ends it after the current
  layer (``Preempted``): the chunk goes back to the queue's front and is warmed from scratch
  later (records already stored are not computed again).

Either way a chunk is warmed as at index time (``BlendEngine.warm``: behind its neighbours, with
its lead record, written through to every shared tier), so the next prompt that holds it hits.
A chunk that cannot be warmed (too long, say) is counted in ``failed`` and forgotten; warming
never raises into a request.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from .blending.warm_forward import between_layers


class Preempted(Exception):
    """Raised between layers to abandon a warm that a request needs the model for."""


class MissQueue:
    """Texts of missed chunks waiting to be warmed: at most ``limit``, each once, oldest first."""

    def __init__(self, limit: int = 256) -> None:
        if limit < 1:
            raise ValueError(f"the warm-on-miss queue limit must be >= 1, got {limit}")
        self.limit = limit
        self._texts: OrderedDict[str, None] = OrderedDict()
        self._ready = threading.Condition()
        self.offered = self.dropped = self.warmed = self.failed = self.preempted = 0

    def __len__(self) -> int:
        return len(self._texts)

    def offer(self, texts: Iterable[str]) -> None:
        """Queues the texts not queued yet; drops (and counts) those that find the queue full."""
        with self._ready:
            for text in texts:
                if text in self._texts:
                    continue
                self.offered += 1
                if len(self._texts) >= self.limit:
                    self.dropped += 1
                    continue
                self._texts[text] = None
            self._ready.notify()

    def take(self, timeout: float | None = None) -> str | None:
        """The oldest queued text (removed), waiting up to ``timeout`` s for one; None if none."""
        with self._ready:
            if not self._texts and not self._ready.wait_for(lambda: bool(self._texts), timeout):
                return None
            return self._texts.popitem(last=False)[0]

    def warm_one(self, warm: Callable[[list[str]], object], pause: Callable[[], None] | None = None) -> bool:
        """Warms the oldest queued text with ``warm`` (no wait); False when the queue is empty."""
        text = self.take(timeout=0)
        if text is None:
            return False
        self.run(warm, text, pause)
        return True

    def run(self, warm: Callable[[list[str]], object], text: str, pause: Callable[[], None] | None = None) -> None:
        """``warm([text])`` with ``pause()`` called before each layer it computes
        (``blending.warm_forward.between_layers``), counted as warmed or failed; never raises. A
        ``Preempted`` warm puts ``text`` back at the queue's front."""
        try:
            with between_layers(pause):
                warm([text])
            self.warmed += 1
        except Preempted:
            self.preempted += 1
            with self._ready:
                self._texts[text] = None
                self._texts.move_to_end(text, last=False)
        except Exception:  # a chunk that cannot be warmed stays a miss; the query path never sees this
            self.failed += 1

    def counts(self) -> dict[str, int]:
        return {"queued": len(self), "offered": self.offered, "dropped": self.dropped,
                "warmed": self.warmed, "failed": self.failed, "preempted": self.preempted}


class IdleClock:
    """Counts prefills in flight; says for how long none has been."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy = 0
        self._since = time.monotonic()

    @contextmanager
    def busy(self) -> Iterator[None]:
        with self._lock:
            self._busy += 1
        try:
            yield
        finally:
            with self._lock:
                self._busy -= 1
                self._since = time.monotonic()

    def idle_for(self) -> float:
        """Seconds since the last prefill ended; 0.0 while one is in flight."""
        with self._lock:
            return 0.0 if self._busy else time.monotonic() - self._since

    def wait_idle(self, idle_s: float, stop: threading.Event) -> None:
        """Returns once nothing has been in flight for ``idle_s`` s; raises ``Preempted`` if
        ``stop`` is set first."""
        while self.idle_for() < idle_s:
            if stop.wait(idle_s / 2):
                raise Preempted


class BackgroundWarmer:
    """A daemon thread that drains a ``MissQueue`` with ``warm`` whenever ``clock`` says idle."""

    def __init__(
        self, warm: Callable[[list[str]], object], queue: MissQueue, clock: IdleClock, idle_s: float = 0.05
    ) -> None:
        self.warm, self.queue, self.clock, self.idle_s = warm, queue, clock, idle_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cacheblend-warm-on-miss", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            text = self.queue.take(timeout=0.2)
            if text is None:
                continue
            try:
                self._pause()  # a chunk starts (its lookups and tokenizing too) only when idle
            except Preempted:
                return
            self.queue.run(self.warm, text, self._pause)

    def _pause(self) -> None:
        """Before each layer of a warm (and before it starts): wait while the engine is busy."""
        self.clock.wait_idle(self.idle_s, self._stop)

    def drain(self, timeout: float = 60.0) -> bool:
        """Waits until the queue is empty and the last taken text is warmed (tests, benchmarks,
        shutdown); True when it emptied within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = self.queue.warmed + self.queue.failed
            if not len(self.queue) and done + self.queue.dropped >= self.queue.offered:
                return True
            time.sleep(0.02)
        return False

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
