"""Proof, without timing, that an async call leaves the event loop free while the engine computes.

Inside ``loop_stays_free(engine)``, the engine's second embedding call (it is mid-generation by
then) blocks until a coroutine on the event loop has run. If the engine computed on the loop's
own thread, that coroutine could not run: the wait ends at its deadline and the check fails.
On any hardware a free loop answers at once, so no speed enters the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


@contextlib.asynccontextmanager
async def loop_stays_free(engine, deadline_s: float = 60.0):
    in_compute, answered = threading.Event(), threading.Event()
    seen = {"calls": 0, "answered_while_computing": False}

    def hook(module, args):
        seen["calls"] += 1
        if seen["calls"] == 2:
            in_compute.set()
            seen["answered_while_computing"] = answered.wait(deadline_s)

    async def answer():
        while not in_compute.is_set():
            await asyncio.sleep(0.001)
        answered.set()

    handle = engine.adapter.body.embed_tokens.register_forward_pre_hook(hook)
    task = asyncio.create_task(answer())
    try:
        yield seen
    finally:
        handle.remove()
        task.cancel()
    assert seen["calls"] >= 2, f"only {seen['calls']} embedding call(s): the call never reached generation"
    assert seen["answered_while_computing"], "the event loop did not run while the engine computed"
