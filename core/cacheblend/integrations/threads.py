"""The async bridge: a blocking engine stream consumed from an event loop.

A prefill is seconds of wall time, so async framework methods must not run the engine on the
event loop. ``iterate_in_thread`` runs each step (building the iterator, then every ``next``) in
the loop's default executor through ``asyncio.to_thread``, which copies the caller's context
variables into the worker (framework callbacks and tracing see their run).

Thread safety: the steps of one stream run one at a time, never overlapping, but not always on
the same worker thread. That is safe: every engine step is a self-contained call (it enters
``torch.inference_mode`` itself and keeps no per-thread state between steps), and the engine
guards its stores and chunk finder with a lock, so several streams may also run at once on
different threads. Nothing runs ahead of the consumer: a consumer that stops early stops the
stream after the step in progress.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

_DONE = object()


async def iterate_in_thread(make: Callable[[], Iterator[T]]) -> AsyncIterator[T]:
    """Yields from the blocking iterator ``make()`` without blocking the event loop.

    ``make`` itself (which may validate input or load the engine) runs in the worker too; its
    exceptions, and the iterator's, are raised to the consumer.
    """
    iterator = await asyncio.to_thread(make)
    while True:
        item = await asyncio.to_thread(next, iterator, _DONE)
        if item is _DONE:
            return
        yield item
