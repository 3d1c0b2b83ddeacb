"""How the integrations read engine streams: from an event loop (``iterate_in_thread``), and
several at once so that their answers share decode steps (``interleave``, from
``cacheblend.generation.turns``).

A prefill is seconds of wall time, so async framework methods must not run the engine on the
event loop. ``iterate_in_thread`` runs each step (building the iterator, then every ``next``) in
the loop's default executor through ``asyncio.to_thread``, which copies the caller's context
variables into the worker (framework callbacks and tracing see their run).

Thread safety: the steps of one stream run one at a time, never overlapping, but not always on
the same worker thread. That is safe: every engine step is a self-contained call (it enters
``torch.inference_mode`` itself and keeps no per-thread state between steps), and the engine
guards its stores and chunk finder with a lock, so several streams may also run at once on
different threads; their answers then decode in the engine's shared batch (a step run for one
reader steps the others' answers too, their pieces kept until read). A stream closed or dropped
before its end frees its seat after the step in progress.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

from ..generation.turns import interleave

__all__ = ["interleave", "iterate_in_thread"]

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

