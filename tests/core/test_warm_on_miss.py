"""Warm on miss in the library: a missed chunk is answered as without it, then warmed in the
background (the same records ``warm`` would store), never while a prefill is in flight; the queue is
bounded and deduplicated, and a chunk that cannot be warmed is counted, never raised."""

import threading
import time

import pytest
import torch
from tiny_models import tiny_model

from cacheblend import BlendConfig, BlendEngine
from cacheblend.warm_on_miss import BackgroundWarmer, IdleClock, MissQueue, Preempted

PASSAGES = [
    "The harbour of Kelm keeps three wooden ships: the Auk, the Tern and the Petrel, all built in Kelm.",
    "Beekeepers on the Varn hills move their hives to the heather fields late in July each year.",
    "Heather honey from the Varn hills is dark and thick; the beekeepers press it from the comb.",
]
QUESTION = "Which ships does Kelm keep?"


def _engines(tokenizer, **config):
    model = tiny_model("llama")
    cfg = BlendConfig(kv_dtype="float32", **config)
    return BlendEngine(model, tokenizer, config=cfg, warm_on_miss=True), BlendEngine(model, tokenizer, config=cfg)


def test_a_miss_is_answered_as_without_warm_on_miss_then_warmed_to_the_records_warm_stores(tokenizer):
    eager, plain = _engines(tokenizer, neighbours=1)  # neighbours and lead records: the default's warming
    try:
        first = eager.prefill(chunks=PASSAGES, query=QUESTION)
        same = plain.prefill(chunks=PASSAGES, query=QUESTION)
        assert first.stats.chunk_misses == 3 and first.stats.hit_tokens == 0
        assert first.missed == PASSAGES
        assert torch.equal(first.output.logits, same.output.logits)  # warm on miss changes no answer
        assert eager.warm_pending(60)
        assert all(eager.kv.is_warm(p) for p in PASSAGES) and eager.kv.misses.warmed == 3
        plain.warm(PASSAGES)  # what index-time warming stores, for comparison
        for text in PASSAGES:  # the same neighbours: the missed prompt's passages were known before any warmed
            key, lead = plain.kv.record_keys(plain.kv.encode(text).ids)
            assert torch.equal(eager.kv.stores.get(key).kv, plain.kv.stores.get(key).kv), text[:20]
            # a batch warm takes a first neighbour's lead record from its neighbour's forward (a longer
            # sequence: float rounding differs), one chunk at a time computes it alone
            torch.testing.assert_close(eager.kv.stores.get(lead).kv, plain.kv.stores.get(lead).kv, atol=1e-5, rtol=0)
        again = eager.prefill(chunks=PASSAGES[::-1], query=QUESTION)
        assert again.stats.chunk_hits == 3 and again.missed == [] and again.stats.hit_tokens > 0
        assert eager.kv.misses.offered == 3  # hits offer nothing
    finally:
        eager.close()


def test_expected_texts_are_found_in_raw_prompts_and_warmed_after_their_first_miss(tokenizer):
    eager, _ = _engines(tokenizer)
    try:
        eager.kv.expect(PASSAGES[:2])
        assert not eager.kv.is_warm(PASSAGES[0])  # expect computes nothing
        prompt = f"Context:\n{PASSAGES[1]}\n\n{PASSAGES[0]}\n\nQuestion: {QUESTION}"
        first = eager.generate(prompt, max_new_tokens=4)
        assert first.stats.chunk_misses == 2 and first.stats.chunk_hits == 0
        assert eager.warm_pending(60)
        second = eager.generate(prompt, max_new_tokens=4)
        assert second.stats.chunk_hits == 2 and second.stats.chunk_misses == 0
    finally:
        eager.close()


def test_nothing_is_warmed_while_a_prefill_is_in_flight():
    clock, queue, calls = IdleClock(), MissQueue(), []
    worker = BackgroundWarmer(calls.append, queue, clock, idle_s=0.05)
    try:
        with clock.busy():
            queue.offer(["a chunk that missed"])
            time.sleep(0.4)
            assert calls == [] and clock.idle_for() == 0.0
        assert worker.drain(5) and calls == [["a chunk that missed"]]
    finally:
        worker.close()


def test_the_queue_is_bounded_deduplicated_and_oldest_first():
    queue = MissQueue(limit=2)
    queue.offer(["a", "b", "a", "c"])
    assert len(queue) == 2 and queue.counts() == {"queued": 2, "offered": 3, "dropped": 1, "warmed": 0, "failed": 0,
                                                "preempted": 0}
    assert queue.take(0) == "a" and queue.take(0) == "b" and queue.take(0) is None


def test_a_chunk_that_cannot_be_warmed_is_counted_and_never_raised():
    queue = MissQueue()

    def warm(texts):
        raise ValueError("a chunk too long for the context window")

    queue.offer(["x" * 40, "y" * 40])
    assert queue.warm_one(warm) and queue.warm_one(warm) and not queue.warm_one(warm)
    assert queue.failed == 2 and queue.warmed == 0


def test_a_prefill_waits_for_at_most_the_one_chunk_being_warmed(tokenizer):
    """A prefill that arrives while the worker drains a queue of six reads its records after at
    most the chunk in flight (the worker waits while a prefill runs), not after the whole queue."""
    eager, _ = _engines(tokenizer)
    try:
        texts = [f"{PASSAGES[0]} Copy {i} of this passage." for i in range(6)]
        started, real_warm = threading.Event(), eager.kv._background.warm

        def slow_warm(batch):  # each chunk takes at least 0.2 s, so the prefill lands inside one
            started.set()
            time.sleep(0.2)
            real_warm(batch)

        eager.kv._background.warm = slow_warm
        seen, real_records = [], eager.prefiller.records

        def records(chunks):
            out = real_records(chunks)
            seen.append(eager.kv.misses.warmed)
            return out

        eager.prefiller.records = records
        eager.kv.misses.offer(texts)
        assert started.wait(30)
        eager.prefill(chunks=PASSAGES[:1], query=QUESTION)
        assert seen and seen[0] <= 1, f"the prefill read its records after {seen[0]} of 6 chunks were warmed"
        assert eager.warm_pending(60) and eager.kv.misses.warmed == 7  # the six, then the prefill's own miss
    finally:
        eager.close()


def test_a_warm_gives_way_between_layers_and_a_prefill_never_waits_for_its_compute(tokenizer):
    """The background warm is held inside its second layer; a prefill that starts then runs to the
    end (the store lock is not held by a warm's compute), the warm computes no further layer while
    the engine is busy, then resumes where it stopped: its records are those of an uninterrupted warm."""
    eager, plain = _engines(tokenizer)
    adapter, layers = eager.adapter, eager.adapter.num_layers
    inside, go, done_layers, real_qkv = threading.Event(), threading.Event(), [], adapter.qkv

    def qkv(layer, h):  # the warm thread's layers are counted; its second one is held until ``go``
        if threading.current_thread().name == "cacheblend-warm-on-miss":
            done_layers.append(layer)
            if len(done_layers) == 2:
                inside.set()
                assert go.wait(30)
        return real_qkv(layer, h)

    adapter.qkv = qkv
    try:
        eager.kv.misses.offer([PASSAGES[0]])
        assert inside.wait(30)
        with eager.kv.clock.busy():  # a prefill or a decode is in flight from here
            go.set()
            out = eager.prefill(chunks=PASSAGES[1:], query=QUESTION)  # would deadlock on a held lock
            time.sleep(0.3)
            assert len(done_layers) == 2, f"the warm computed layers {done_layers} while the engine was busy"
            assert out.stats.chunk_misses == 2
        assert eager.warm_pending(60) and eager.kv.misses.warmed >= 1
        assert done_layers[:layers] == list(range(layers))  # resumed at layer 2, not restarted
        plain.warm(PASSAGES[:1])
        key = plain.kv.keys(PASSAGES[:1])[0]
        assert torch.equal(eager.kv.stores.get(key).kv, plain.kv.stores.get(key).kv)
    finally:
        adapter.qkv = real_qkv
        eager.close()


def test_the_server_ends_a_warm_when_a_request_arrives_and_warms_the_chunk_again_when_idle(tokenizer):
    """The model thread warms a missed chunk while idle; work queued during its second layer ends
    it after that layer (the call runs next, not after the warm), and the chunk is warmed later."""
    import asyncio

    from cacheblend.serving.scheduler import Scheduler

    engine, plain = _engines(tokenizer)
    engine.close()  # the library's background thread is not the server's
    adapter, real_qkv, warming = engine.adapter, engine.adapter.qkv, threading.Event()
    inside, go, layers = threading.Event(), threading.Event(), []

    def qkv(layer, h):
        if warming.is_set():
            layers.append(layer)
            if len(layers) == 2:
                inside.set()
                assert go.wait(30)
        return real_qkv(layer, h)

    def warm(texts):
        warming.set()
        try:
            return engine.warm(texts, progress=False)
        finally:
            warming.clear()

    adapter.qkv = qkv
    scheduler = Scheduler(engine, warm_on_miss=warm)
    scheduler.misses.offer([PASSAGES[0]])
    scheduler.start()
    try:
        assert inside.wait(30)

        async def ask():
            answer = asyncio.ensure_future(scheduler.call(lambda: list(layers)))
            await asyncio.sleep(0.05)  # the call is queued
            go.set()
            return await answer

        assert asyncio.run(ask()) == [0, 1]  # ran right after the layer in flight
        assert scheduler.misses.preempted == 1 and scheduler.misses.failed == 0
        deadline = time.monotonic() + 30
        while scheduler.misses.warmed < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert scheduler.misses.warmed == 1 and engine.kv.is_warm(PASSAGES[0])
        plain.warm(PASSAGES[:1])
        key = plain.kv.keys(PASSAGES[:1])[0]
        assert torch.equal(engine.kv.stores.get(key).kv, plain.kv.stores.get(key).kv)
    finally:
        scheduler.stop()
        adapter.qkv = real_qkv


def test_a_preempted_warm_goes_back_to_the_queue_front_and_is_warmed_next():
    queue, seen = MissQueue(), []
    queue.offer(["first", "second"])

    def preempt():
        raise Preempted

    def warm(texts):  # a warm that reaches its first layer (``between_layers``' hook)
        from cacheblend.blending.warm_forward import _HOOK

        seen.append(texts[0])
        hook = _HOOK.get()
        if hook is not None:
            hook()

    assert queue.warm_one(warm, preempt)
    assert queue.counts()["preempted"] == 1 and queue.warmed == 0 and queue.failed == 0
    assert len(queue) == 2
    assert queue.warm_one(warm) and queue.warmed == 1 and seen == ["first", "first"]  # back at the front
    assert queue.take(0) == "second"


def test_a_chunk_warmed_on_miss_lands_in_the_attached_disk_store_for_the_next_process(tokenizer, tmp_path):
    model = tiny_model("llama")
    cfg = BlendConfig(kv_dtype="float32", neighbours=0)
    eager = BlendEngine(model, tokenizer, config=cfg, warm_on_miss=True)
    try:
        eager.attach_store(tmp_path / "kv")
        assert eager.prefill(chunks=PASSAGES[:2], query=QUESTION).stats.chunk_misses == 2
        assert eager.warm_pending(60)
    finally:
        eager.close()
    later = BlendEngine(model, tokenizer, config=cfg)  # a new process: nothing in memory
    later.attach_store(tmp_path / "kv")
    assert later.prefill(chunks=PASSAGES[:2], query=QUESTION).stats.chunk_hits == 2


def test_nothing_is_warmed_while_a_generation_streams(tokenizer):
    """The whole generation (prefill and decoding) keeps the worker off the model, so a background
    warm never slows the answer being streamed (nor a full prefill measured beside it)."""
    eager, _ = _engines(tokenizer)
    try:
        stream = eager.stream(chunks=PASSAGES[:1], query=QUESTION, max_new_tokens=32)
        next(stream)  # prefilled, its miss queued, decoding under way
        time.sleep(0.4)
        assert eager.kv.misses.offered == 1 and eager.kv.misses.warmed == 0  # taken by the worker, which waits
        stream.consume()
        assert eager.warm_pending(60) and eager.kv.misses.warmed == 1
    finally:
        eager.close()


def test_a_warm_cap_warms_the_first_texts_and_leaves_the_rest_to_warm_on_miss(tokenizer):
    from cacheblend.integrations import WarmCap

    _, engine = _engines(tokenizer)  # no warm on miss yet: the cap switches it on
    try:
        cap = WarmCap(1)
        assert cap.split(engine, PASSAGES[:1]) == PASSAGES[:1]  # within the cap
        engine.warm(PASSAGES[:1])
        assert cap.split(engine, PASSAGES[1:]) == [] and engine.kv.misses is not None  # past it: expected only
        prompt = f"{PASSAGES[0]}\n\n{PASSAGES[1]}\n\n{PASSAGES[2]}\n\n{QUESTION}"
        first = engine.generate(prompt, max_new_tokens=2)
        assert (first.stats.chunk_hits, first.stats.chunk_misses) == (1, 2)
        assert engine.warm_pending(60)
        assert engine.generate(prompt, max_new_tokens=2).stats.chunk_hits == 3
        assert WarmCap(None).split(engine, ["x"]) == ["x"]
        for bad in (-1, 1.5, True):
            with pytest.raises(ValueError, match="warm_limit"):
                WarmCap(bad)
    finally:
        engine.close()
