"""Several iterators read in turn (plain Python, no torch: the integrations import it).

Engine streams read this way decode together: each read of one runs the engine's shared decode
step for every answer seated in it (``shared.SharedDecode``), so N answers take about the steps of
the longest instead of the sum. ``BlendEngine.generate_many`` and LangChain's ``CacheBlendLLM``
batches read their streams so.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


def interleave(iterators: Sequence[Iterator[T]]) -> Iterator[tuple[int, T]]:
    """``(i, item)`` from every iterator in turn until all are exhausted (items must not be None).
    Each engine stream's prefill runs at its first read, one after another. Whatever is left
    unread is closed at the end (an early exit frees the seats)."""
    live = list(enumerate(iterators))
    try:
        while live:
            for entry in list(live):
                item = next(entry[1], None)
                if item is None:
                    live.remove(entry)
                else:
                    yield entry[0], item
    finally:
        for _, it in live:
            close = getattr(it, "close", None)
            if close is not None:
                close()
