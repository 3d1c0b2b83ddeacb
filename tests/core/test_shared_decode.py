"""Answers that overlap in time share the engine's decode steps (``generation/shared.py``): read in
turn or from threads, each answer is the one it gets alone, token for token; the batch steps them
together, frees a closed stream's seat, and fails every answer of a step that fails, then recovers."""

import threading

import pytest

from cacheblend.generation.batch import SlotKV
from cacheblend.integrations import interleave

CHUNKS = ["The vault code is written on a card behind the clock.", "The clock in the hall is always five minutes fast.",
          "A brass key hangs on the hook beside the garden door."]
ASKS = [dict(chunks=CHUNKS, query="Where is the code?"), dict(chunks=CHUNKS[::-1], query="Is the clock right?"),
        dict(chunks=CHUNKS[1:], query="What hangs by the door?", recompute_ratio=1.0),
        dict(chunks=CHUNKS[:2], query="Why?", recompute_ratio=0.0)]


def _alone(engine, **options):
    return [engine.generate(**ask, **options) for ask in ASKS]


def _read_in_turn(engine, **options):
    streams = [engine.stream(**ask, **options) for ask in ASKS]
    pieces = [[] for _ in streams]
    for i, piece in interleave(streams):
        pieces[i].append(piece)
    assert ["".join(p) for p in pieces] == [s.result.text for s in streams]
    return [s.result for s in streams]


@pytest.fixture
def engine(make_engine):
    engine = make_engine()
    engine.warm(CHUNKS)
    return engine


def test_streams_read_in_turn_share_steps_and_answer_as_alone(engine):
    """Four streams read in turn: each answer equals its answer alone (greedy; with a stop string that
    ends them at different steps; seeded sampling), and the steps stepped several answers at once."""
    stop = engine.generate(**ASKS[1], max_new_tokens=12).text.split()[3]
    for options in [dict(max_new_tokens=12), dict(max_new_tokens=12, stop=[stop]),
                    dict(max_new_tokens=8, temperature=1.0, top_k=50, seed=3)]:
        alone = _alone(engine, **options)
        before = (engine.decoder.steps, engine.decoder.rows)
        together = _read_in_turn(engine, **options)
        assert [g.token_ids for g in together] == [g.token_ids for g in alone], options
        for a, b in zip(together, alone):
            assert (a.text, a.stats.finish_reason, a.stats.recomputed_tokens) == (
                b.text, b.stats.finish_reason, b.stats.recomputed_tokens)
        steps, rows = engine.decoder.steps - before[0], engine.decoder.rows - before[1]
        # alone, each answer takes a step per token after its first: together, about the longest's
        assert steps <= max(len(g.token_ids) for g in together) + len(ASKS), (steps, rows)
        assert rows >= 2 * steps - len(ASKS), (steps, rows)  # most steps stepped several answers
    assert engine.decoder.peak == len(ASKS) and engine.decoder.active == 0


def test_a_batch_of_one_decodes_the_answers_one_after_another(make_engine):
    engine = make_engine(decode_batch=1)
    engine.warm(CHUNKS)
    alone = _alone(engine, max_new_tokens=10)
    assert [g.token_ids for g in _read_in_turn(engine, max_new_tokens=10)] == [g.token_ids for g in alone]
    assert engine.decoder.peak == 1 and engine.decoder.steps == engine.decoder.rows


def test_threads_answer_as_alone_and_all_finish(engine):
    """Four threads stream at once (started together): every answer is its answer alone and every
    thread ends (a reader waiting for a seat or a piece runs the steps itself)."""
    alone = _alone(engine, max_new_tokens=10)
    out, errors = [None] * len(ASKS), []
    start = threading.Barrier(len(ASKS))

    def run(i):
        try:
            start.wait()
            out[i] = engine.generate(**ASKS[i], max_new_tokens=10)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(ASKS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and errors == []
    assert [g.token_ids for g in out] == [g.token_ids for g in alone]
    assert engine.decoder.active == 0


def test_a_closed_stream_leaves_the_batch_and_the_others_go_on(engine):
    alone = _alone(engine, max_new_tokens=12)
    first, second = engine.stream(**ASKS[0], max_new_tokens=12), engine.stream(**ASKS[1], max_new_tokens=12)
    got = [next(first), next(second), next(first), next(second)]  # both seated
    assert engine.decoder.active == 2 and all(got)
    second.close()
    rest = "".join(first)
    assert got[0] + got[2] + rest == alone[0].text and first.result.token_ids == alone[0].token_ids
    assert second.result is None and engine.decoder.active == 0


def test_a_failed_step_fails_every_answer_in_it_and_the_batch_recovers(engine, monkeypatch):
    """Fault injection: the batched forward raises once. Both seated answers raise it; the next
    generation runs on a fresh batch and equals its answer alone."""
    alone = _alone(engine, max_new_tokens=12)
    real, calls = SlotKV.step, []

    def failing(self, tokens):
        calls.append(len(tokens))
        if len(calls) == 2:
            raise RuntimeError("injected decode failure")
        return real(self, tokens)

    monkeypatch.setattr(SlotKV, "step", failing)
    first, second = engine.stream(**ASKS[0], max_new_tokens=12), engine.stream(**ASKS[1], max_new_tokens=12)
    next(first), next(second), next(first)  # the first step (one seated); the second seats the other
    with pytest.raises(RuntimeError, match="injected"):
        list(second)
    with pytest.raises(RuntimeError, match="injected"):
        list(first)
    assert calls[1] == 2 and engine.decoder.active == 0
    monkeypatch.setattr(SlotKV, "step", real)
    assert engine.generate(**ASKS[2], max_new_tokens=12).token_ids == alone[2].token_ids


def _in_thread(fn):
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


def test_a_step_waits_for_a_queued_prefill(engine):
    """Prefills go first: a reader that needs a step waits while a prefill holds the model and while
    another waits for it (answers arriving together are seated before the batch moves), then steps."""
    decoder = engine.decoder
    stream = engine.stream(**ASKS[0], max_new_tokens=12)
    got = [next(stream), next(stream)]  # seated, one step taken
    holding, release = [threading.Event(), threading.Event()], [threading.Event(), threading.Event()]
    first = _in_thread(lambda: decoder.exclusive(lambda: holding[0].set() or release[0].wait(30)))
    assert holding[0].wait(30)
    steps = decoder.steps
    reader = _in_thread(lambda: got.append(next(stream)))
    reader.join(0.3)
    assert reader.is_alive() and decoder.steps == steps  # the model is held
    second = _in_thread(lambda: decoder.exclusive(lambda: holding[1].set() or release[1].wait(30)))
    second.join(0.3)  # queued after the reader
    release[0].set()  # the queued prefill still goes before the step
    assert holding[1].wait(30) and decoder.steps == steps
    reader.join(0.3)
    assert reader.is_alive()
    release[1].set()
    for thread in (first, second, reader):
        thread.join(30)
    assert not reader.is_alive() and decoder.steps == steps + 1 and len(got) == 3 and all(got)
    stream.close()
    assert decoder.active == 0
