"""The model thread: continuous batching of blended prefills and batched decode steps.

One thread owns the model. It takes work from a bounded queue: waiting requests are prefilled
(blended, one after another) between decode steps and join the batch; every step then runs ONE
forward for all active sequences (``generation.lockstep.Lockstep``, the decode loop the library shares).

Prefills go first, as in vLLM's scheduler: before each decode step the thread admits waiting
requests while slots are free, until the prefills of this round have computed
``max_prefill_tokens`` tokens (at least one request per round). A blended prefill computes about
a fifth of its prompt (15% of its chunks and every uncached token), so requests that arrive
together are all admitted before the batch moves on, and none waits behind the others' decode
steps; full prefills use the budget faster, which bounds how long one round stalls the streams
already decoding (the same role as vLLM's ``max_num_batched_tokens``). Blended prefills are not
padded into one batched forward: on a CPU a forward is compute-bound, so batching them would
save no time, only add padding.

Calls such as warming run on the same thread, so the model is never used by two threads at once.
Warm on miss (``cacheblend.warm_on_miss``) too: a request's ``documents`` are looked for in its
prompt without being warmed first, each chunk its prefill finds in no tier goes to a ``MissQueue``,
and the thread warms one queued chunk per round only when no request waits or decodes, so a first
retrieval costs about a full prefill of its new passages, not the three a warm before the prefill
cost, and the next request holding them hits. A request that arrives during such a warm ends it
after the layer being computed (``Preempted``; the chunk goes back to the queue's front), so it
waits a layer, not a warm. The ASGI side submits jobs and reads their events from an
asyncio queue fed with ``call_soon_threadsafe``; it cancels a job by setting ``job.cancelled``,
which frees the job's slot before the next step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..generation.decode import Decoding
from ..generation.lockstep import Answer, Lockstep
from ..warm_on_miss import MissQueue, Preempted
from .jobs import Event, Job, QueueFull
from .metrics import Metrics


@dataclass
class _Call:
    fn: Callable[[], Any]
    future: concurrent.futures.Future


class Scheduler:
    """Owns the engine's model on one thread; see the module docstring."""

    def __init__(
        self,
        engine: Any,
        *,
        max_batch: int = 8,
        max_queue: int = 64,
        max_prefill_tokens: int = 4096,
        metrics: Metrics | None = None,
        warm_on_miss: Callable[[list[str]], Any] | None = None,
    ):
        if max_batch < 1 or max_queue < 1 or max_prefill_tokens < 1:
            raise ValueError(
                f"max_batch, max_queue and max_prefill_tokens must be >= 1, "
                f"got {max_batch}, {max_queue} and {max_prefill_tokens}"
            )
        self.engine = engine
        self.max_batch = max_batch
        self.max_prefill_tokens = max_prefill_tokens
        self.metrics = metrics or Metrics()
        # warm_on_miss: how a missed chunk is warmed (engine.warm into the server's stores); None:
        # a request's documents are warmed before its prefill, and misses stay misses
        self.warm, self.misses = warm_on_miss, MissQueue() if warm_on_miss is not None else None
        self._pending: queue.Queue = queue.Queue(maxsize=max_queue)
        self._batch = self._lockstep()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cacheblend-model", daemon=True)

    # -- the ASGI side ------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    @property
    def queue_depth(self) -> int:
        return self._pending.qsize()

    @property
    def active(self) -> int:
        return len(self._batch.active)

    def submit(self, job: Job) -> asyncio.Queue:
        """Queues ``job``; returns the asyncio queue of its events. Raises QueueFull."""
        job.loop = asyncio.get_running_loop()
        job.events = asyncio.Queue()
        self._put(job)
        return job.events

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Runs ``fn()`` on the model thread (e.g. warming) and returns its result."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._put(_Call(fn, future))
        return await asyncio.wrap_future(future)

    def _put(self, item: Job | _Call) -> None:
        try:
            self._pending.put_nowait(item)
        except queue.Full:
            raise QueueFull from None
        self.metrics.set_queue(self._pending.qsize())

    # -- the model thread ---------------------------------------------------------------------
    def _run(self) -> None:
        with torch.inference_mode():
            while not self._stop.is_set():
                try:
                    self._iterate()
                except Exception as exc:  # a failure in the batch fails its requests, not the server
                    self._fail_all(exc)
        self._fail_all(RuntimeError("the server is shutting down"))

    def _yield(self) -> None:
        """Before each layer of a missed chunk's warm: a request waiting (or shutdown) ends it."""
        if not self._pending.empty() or self._stop.is_set():
            raise Preempted

    def _iterate(self) -> None:
        """One round: admit waiting work within the prefill budget, then one decode step; with
        nothing waiting or decoding, warm one missed chunk instead."""
        self._drop_cancelled()
        if not self._batch.active and self._pending.empty() and self.misses is not None and self.misses.warm_one(self.warm, self._yield):
            return
        budget = self.max_prefill_tokens
        while self._batch.free and budget > 0:
            try:  # block briefly only when there is nothing to decode
                item = self._pending.get(timeout=0.05) if not self._batch.active else self._pending.get_nowait()
            except queue.Empty:
                break
            finally:
                self.metrics.set_queue(self._pending.qsize())
            if isinstance(item, _Call):
                self._run_call(item)
                break  # a call (warming) may be long: let the batch move before more admissions
            if item.cancelled.is_set():
                continue
            try:
                budget -= self._admit(item)
            except Exception as exc:
                item.emit(Event("error", error=exc))
                raise
        if self._batch.active:
            self._step()

    def _lockstep(self) -> Lockstep:
        return Lockstep(self.engine.adapter, self.max_batch, self.engine.eos_ids, on_redo=self.metrics.redone)

    def _fail_all(self, exc: Exception) -> None:
        for answer in self._batch.active:
            answer.tag.emit(Event("error", error=exc))
        self._batch = self._lockstep()

    def _run_call(self, call: _Call) -> None:
        try:
            call.future.set_result(call.fn())
        except Exception as exc:  # handed to the awaiting request
            call.future.set_exception(exc)

    def _admit(self, job: Job) -> int:
        """Blended prefill of ``job``, its first token, and its place in the batch; returns the
        tokens its prefill computed (what it spent of the round's prefill budget)."""
        engine = self.engine
        try:
            if job.documents:
                engine.kv.expect(job.documents) if self.misses is not None else engine.warm(job.documents)
            request = engine.request(job.prompt)  # searched for chunks and tokenized once
            pre = engine.prefill(request, recompute_ratio=job.recompute_ratio)
            if self.misses is not None:
                self.misses.offer(pre.missed)
        except Exception as exc:  # bad input or a model failure: the request fails, the server goes on
            job.emit(Event("error", error=exc))
            return 1
        decoding = Decoding(job.max_tokens or engine.context_window, job.sampling, job.stop)
        answer = Answer.of(pre, decoding, engine.tokenizer, engine.context_window, job.arrived, tag=job)
        self.metrics.prefilled(pre.stats)
        piece, pre = self._batch.first(answer, pre)  # the first token (the doubt gate may redo the prefill first)
        if answer.next_token >= 0:
            self.metrics.first_token(answer.stats.ttft_s)
        job.emit(Event("start", stats=replace(answer.stats)))
        self._emit(answer, piece)
        if not answer.done:  # a draft's tokens verified in one forward, after the first is out; then a slot
            piece, pre = self._batch.verify_draft(answer, pre)
            self._emit(answer, piece)
        if not answer.done:
            self._batch.seat(answer, pre)
        redone = answer.stats.recomputed_tokens if answer.stats.doubt_step is not None else 0
        return max(1, pre.stats.recomputed_tokens + redone)

    def _emit(self, answer: Answer, piece: str) -> None:
        """The events (and metrics) of ``answer``'s latest token: its text, and 'done' when it ended."""
        job, stats = answer.tag, answer.stats
        if piece:
            job.emit(Event("text", text=piece))
        if answer.done:
            self.metrics.completed(stats)
            job.emit(Event("done", stats=stats))

    def _step(self) -> None:
        """One batched forward for every active answer, then sampling per row."""
        batch = len(self._batch.active)
        stepped = self._batch.step()
        self.metrics.decode_step(batch, self._batch.forward_s)  # the forward's time, as the metric says
        for answer, piece in stepped:
            self._emit(answer, piece)

    def _drop_cancelled(self) -> None:
        self._batch.drop([i for i, a in enumerate(self._batch.active) if a.tag.cancelled.is_set()])
