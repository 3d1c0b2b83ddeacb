"""Running the blocking engine off the event loop.

The engine computes on the calling thread (torch releases the GIL inside kernels, but a prefill
is still seconds of wall time), so the async LlamaIndex methods hand the work to a thread. A
stream is produced by ONE dedicated thread from its first token to its last: torch keeps grad
and inference modes per thread, so a generator must not hop between pool threads per token.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import TypeVar

T = TypeVar("T")

_DONE = object()


async def iterate_in_thread(items: Iterator[T]) -> AsyncIterator[T]:
    """Yields ``items`` (a blocking iterator) while a worker thread advances it.

    Exceptions raised by the iterator are re-raised here. If the consumer stops early, the
    worker stops after the item in progress and closes the iterator.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stop = threading.Event()

    def send(item: object, error: BaseException | None = None) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (item, error))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            stop.set()

    def produce() -> None:
        try:
            for item in items:
                if stop.is_set():
                    break
                send(item)
        except BaseException as exc:  # handed to the consumer, raised there
            send(_DONE, exc)
            return
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()
        send(_DONE)

    worker = threading.Thread(target=produce, name="cacheblend-stream", daemon=True)
    worker.start()
    try:
        while True:
            item, error = await queue.get()
            if item is _DONE:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
