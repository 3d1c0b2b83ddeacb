"""Answers of one engine that overlap in time share its decode steps: ``engine.stream`` and
``generate`` calls from several threads (LangChain's ``batch``, an event loop's workers) or
iterators read in turn (``turns.interleave``) decode in one ``Lockstep``.

Each answer picks its first token from its own prefill (it waits for no seat to do so), then takes
a seat in the engine's batch. Whoever needs the next step runs it for every seated answer and
posts each answer's text to its mailbox; there is no model thread: a reader that waits for text, or
for a free seat, runs the step itself when no one else is, so the batch moves as long as anyone
reads, and an answer whose reader stopped is stepped to its end or dropped when its stream closes.
An answer alone in the batch takes the steps a one-answer loop takes (one row, the same products);
answers that share a step are equal to those up to fp32 round-off (a batched product sums in
another order). The batch's buffers are freed when its last answer leaves.

Prefills and steps take turns (``exclusive``): side by side they would only split the cores (a CPU
forward is compute-bound and one forward already uses every core). Prefills go first, as in the
server's scheduler: a step waits while prefills are queued, so answers that arrive together are
all seated before the batch moves on, until the prefills since the last step have computed
``prefill_budget`` tokens (the server's ``max_prefill_tokens``), which bounds how long a stream of
arrivals stalls the answers already decoding.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..models.adapter import ModelAdapter
from .decode import Prefilled
from .lockstep import Answer, Lockstep


@dataclass
class _Mailbox:
    """What the steps left for one seated answer (its ``Answer.tag``)."""

    pieces: deque = field(default_factory=deque)
    done: bool = False  # set with the last piece posted (not ``Answer.done``, set mid-step)
    error: BaseException | None = None
    left: bool = False  # its reader closed the stream: drop it at the next chance


class SharedDecode:
    """The engine's one batch of decoding answers, at most ``max_batch`` at a time (a further
    answer waits for a seat, stepping the batch meanwhile). ``steps``, ``rows`` and ``peak``
    count the batched steps, the answers they stepped, and the most seated at once."""

    def __init__(self, adapter: ModelAdapter, eos_ids: set[int], max_batch: int = 16,
                 prefill_budget: int = 4096) -> None:
        if max_batch < 1 or prefill_budget < 1:
            raise ValueError(f"max_batch and prefill_budget must be >= 1, got {max_batch} and {prefill_budget}")
        self.adapter, self.eos_ids, self.max_batch, self.prefill_budget = adapter, eos_ids, max_batch, prefill_budget
        self._cond = threading.Condition()
        self._model = threading.Lock()  # held by a prefill or a step: they take turns
        self._queued = 0  # prefills waiting for or holding the model
        self._spent = 0  # tokens the prefills since the last step computed
        self._picker = Lockstep(adapter, 1, eos_ids)  # first tokens only: never seated, never stepped
        self._batch = Lockstep(adapter, max_batch, eos_ids)
        self._stepping = False
        self.steps = self.rows = self.peak = 0

    @property
    def active(self) -> int:
        """Answers seated now."""
        with self._cond:
            return len(self._batch.active)

    def exclusive(self, fn, *args: Any) -> Any:
        """``fn(*args)`` (a prefill) with the model to itself: no step or other prefill runs meanwhile,
        and no step starts while it waits (within the prefill budget)."""
        with self._cond:
            self._queued += 1
        out = None
        try:
            with self._model:
                out = fn(*args)
            return out
        finally:
            with self._cond:
                self._queued -= 1
                if isinstance(out, Prefilled):
                    self._spent += out.stats.recomputed_tokens
                self._cond.notify_all()

    def answer(self, answer: Answer, pre: Prefilled) -> Iterator[str]:
        """``answer``'s text pieces: its first token's from ``pre``, then the shared steps'. It takes
        its seat before its first piece when one is free at once (answers read in turn then all
        join the first step), else at its next read; with a draft (``Lockstep.verify_draft``), after
        its first piece and the draft's verifying forward."""
        piece, pre = self.exclusive(self._picker.first, answer, pre)  # the doubt gate may prefill again
        if not answer.done and pre.output.draft:  # the first token out, then the draft verified (lockstep.py)
            if piece:
                yield piece
            piece, pre = self.exclusive(self._picker.verify_draft, answer, pre)
        if answer.done:
            if piece:
                yield piece
            return
        box = _Mailbox()
        answer.tag = box
        seated = self._seat(answer, pre, wait=False)
        try:
            if piece:
                yield piece
            if not seated:
                self._seat(answer, pre, wait=True)
            while (piece := self._next(box)) is not None:
                yield piece
        finally:
            self._leave(answer, box)

    def _seat(self, answer: Answer, pre: Prefilled, wait: bool) -> bool:
        """Seats ``answer``: at once, or (``wait``) after stepping the batch until a seat is free."""
        with self._cond:
            if wait:
                self._drive(lambda: not self._stepping and self._batch.free > 0)
            elif self._stepping or not self._batch.free:
                return False
            self._batch.seat(answer, pre)
            self.peak = max(self.peak, len(self._batch.active))
            return True

    def _next(self, box: _Mailbox) -> str | None:
        """The next piece for ``box``'s answer; None once it has ended."""
        with self._cond:
            self._drive(lambda: bool(box.pieces) or box.done or box.error is not None)
            if box.pieces:
                return box.pieces.popleft()
            if box.error is not None:
                raise box.error
            return None

    def _leave(self, answer: Answer, box: _Mailbox) -> None:
        """The reader is gone (finished, or closed the stream early): an unfinished answer leaves
        the batch now, or after the step in progress (never waiting: this may run in a finalizer)."""
        with self._cond:
            box.left = True
            if not self._stepping:
                self._drop_left()

    def _drive(self, ready) -> None:
        """With the lock held: until ``ready()``, runs the next step whenever no one else is."""
        while not ready():
            prefills_first = self._queued and self._spent < self.prefill_budget
            if self._stepping or not self._batch.active or prefills_first:
                self._cond.wait()
            else:
                self._step()

    def _step(self) -> None:
        """One batched step, run without the lock (readers keep posting and seating waits); its
        pieces posted to the mailboxes. A failed step fails every answer in it."""
        batch, self._stepping, self._spent = self._batch, True, 0
        error = None
        self._cond.release()
        try:
            with self._model:
                stepped = batch.step()
        except BaseException as exc:  # noqa: BLE001 - handed to every reader of the batch
            stepped, error = [], exc
        finally:
            self._cond.acquire()
            self._stepping = False
        if error is not None:
            for answer in batch.active:
                answer.tag.error = error
            batch.active.clear()
        self.steps, self.rows = self.steps + (error is None), self.rows + len(stepped)
        for answer, piece in stepped:
            box = answer.tag
            if piece:
                box.pieces.append(piece)
            box.done = answer.done
        self._drop_left()
        self._cond.notify_all()

    def _drop_left(self) -> None:
        """Drops answers whose readers left; a batch left empty is replaced (its buffers freed)."""
        batch = self._batch
        batch.drop([i for i, a in enumerate(batch.active) if a.tag.left and not a.done])
        if not batch.active:
            self._batch = Lockstep(self.adapter, self.max_batch, self.eos_ids)

