"""One answer streamed as text pieces: the library's ``engine.stream``/``generate``/``generate_from``.

It decodes through the package's one decode loop (``lockstep.Lockstep``) with a single slot, so
a streamed answer and an answer the server batches with others take the same steps.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

from ..result import Generation
from .decode import Decoding
from .lockstep import Answer, Lockstep


class GenerationStream:
    """An iterator of text pieces; after exhaustion ``result`` is the whole Generation.

    Work starts at the first ``next()``; ``ttft_s`` and ``total_s`` count from there.
    """

    def __init__(
        self, prefill, decoding: Decoding, tokenizer: Any, eos_ids: set[int], window: int, busy=nullcontext
    ) -> None:
        """``prefill(started) -> Prefilled`` runs lazily, at the first ``next()``; ``busy()`` is a
        context held from then until the last piece (the engine's ``IdleClock``: no background
        warming while a generation runs)."""
        self.result: Generation | None = None
        self._it = self._busy(busy, self._run(prefill, decoding, tokenizer, eos_ids, window))

    @staticmethod
    def _busy(busy, pieces: Iterator[str]) -> Iterator[str]:
        with busy():
            yield from pieces

    def __iter__(self) -> Iterator[str]:
        return self._it

    def __next__(self) -> str:
        return next(self._it)

    def consume(self) -> Generation:
        for _ in self._it:
            pass
        return self.result

    def _run(self, prefill, decoding: Decoding, tokenizer, eos_ids, window) -> Iterator[str]:
        started = time.perf_counter()
        pre = prefill(started)
        answer = Answer.of(pre, decoding, tokenizer, window, started)
        lock = Lockstep(pre.adapter, 1, eos_ids)
        piece = lock.admit(answer, pre)
        while True:
            if piece:
                yield piece
            if answer.done:
                break
            ((_, piece),) = lock.step()
        self.result = answer.generation
