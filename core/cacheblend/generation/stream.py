"""One answer streamed as text pieces: the library's ``engine.stream``/``generate``/``generate_from``.

It decodes through the package's one decode loop (``lockstep.Lockstep``), in the engine's shared
batch (``shared.SharedDecode``): streams that overlap in time share each decode step, and a stream
alone takes the steps a one-answer loop takes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

from ..result import Generation
from .decode import Decoding
from .lockstep import Answer
from .shared import SharedDecode


class GenerationStream:
    """An iterator of text pieces; after exhaustion ``result`` is the whole Generation.

    Work starts at the first ``next()``; ``ttft_s`` and ``total_s`` count from there.
    """

    def __init__(
        self, prefill, decoding: Decoding, tokenizer: Any, window: int, decoder: SharedDecode, busy=nullcontext
    ) -> None:
        """``prefill(started) -> Prefilled`` runs lazily, at the first ``next()``; ``decoder`` is the
        engine's shared batch; ``busy()`` is a context held from then until the last piece (the
        engine's ``IdleClock``: no background warming while a generation runs)."""
        self.result: Generation | None = None
        self._it = self._busy(busy, self._run(prefill, decoding, tokenizer, window, decoder))

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

    def close(self) -> None:
        """Stops the answer (its seat in the shared batch is freed); ``result`` stays None."""
        self._it.close()

    def _run(self, prefill, decoding: Decoding, tokenizer, window, decoder: SharedDecode) -> Iterator[str]:
        started = time.perf_counter()
        pre = decoder.exclusive(prefill, started)  # prefills and decode steps take turns
        answer = Answer.of(pre, decoding, tokenizer, window, started)
        yield from decoder.answer(answer, pre)
        self.result = answer.generation
