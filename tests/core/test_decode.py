"""Decoding: stop strings, streaming, sampling determinism."""

import pytest
import torch

from cacheblend.generation.decode import Sampling, TextTracker

CHUNKS = ["The vault code is written on a card behind the clock.", "The clock in the hall is always five minutes fast."]


class CharTokenizer:
    """Decodes ids as characters, to test stop handling independently of any vocabulary."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def feed(tracker, text, final=True):
    out = []
    for ch in text:
        tracker.push(ord(ch))
        if tracker.stopped:
            break
        out.append(tracker.delta(final=False))
    out.append(tracker.delta(final=final))
    return out


def test_multi_token_stop_string_never_leaks_into_streamed_text():
    tracker = TextTracker(CharTokenizer(), stop=["END!"])
    pieces = feed(tracker, "hello EN world END! more")
    assert tracker.stopped and tracker.text == "hello EN world "
    assert "".join(pieces) == tracker.text
    assert not any("END" in p for p in pieces)


def test_streamed_pieces_join_to_the_final_text(make_engine):
    engine = make_engine()
    engine.warm(CHUNKS)
    stream = engine.stream(chunks=CHUNKS, query="Where is the code?", max_new_tokens=12)
    pieces = list(stream)
    result = stream.result
    assert "".join(pieces) == result.text and result.stats.completion_tokens == len(result.token_ids)
    assert result.stats.chunk_hits == 2 and result.stats.ttft_s <= result.stats.total_s


def test_stop_string_cuts_the_answer(make_engine):
    engine = make_engine()
    full = engine.generate(chunks=CHUNKS, query="q", max_new_tokens=12, recompute_ratio=1.0)
    assert len(full.text) > 2
    stop = full.text[1:3]
    cut = engine.generate(chunks=CHUNKS, query="q", max_new_tokens=12, recompute_ratio=1.0, stop=[stop])
    assert cut.text == full.text[: full.text.find(stop)] and cut.stats.finish_reason == "stop"


def test_max_new_tokens_and_finish_reason(make_engine):
    engine = make_engine()
    out = engine.generate(chunks=CHUNKS, query="q", max_new_tokens=3)
    assert len(out.token_ids) <= 3
    if len(out.token_ids) == 3:
        assert out.stats.finish_reason == "length"


def test_seeded_sampling_is_reproducible(make_engine):
    engine = make_engine()
    kw = dict(chunks=CHUNKS, query="q", max_new_tokens=8, temperature=1.0, top_p=0.9, top_k=50)
    a = engine.generate(seed=7, **kw).token_ids
    assert a == engine.generate(seed=7, **kw).token_ids


def test_sampling_filters():
    logits = torch.tensor([0.0, 5.0, 4.9, -3.0])
    greedy = Sampling()
    assert greedy.pick(logits, None) == 1
    topk = Sampling(temperature=1.0, top_k=2, seed=0)
    gen = topk.generator(torch.device("cpu"))
    assert {topk.pick(logits, gen) for _ in range(50)} <= {1, 2}
    topp = Sampling(temperature=1.0, top_p=0.01, seed=0)
    assert {topp.pick(logits, topp.generator(torch.device("cpu"))) for _ in range(20)} == {1}


def test_a_vanishing_temperature_samples_the_argmax():
    """The fuzzer's find: temperature 1e-61 is 0 in fp32, and fp32 logits / it gave 0/0 = nan (a 500
    from the server). Any positive temperature is a valid request; near 0 it is greedy."""
    logits = torch.tensor([0.0, 5.0, 4.9, -3.0, float("-inf")])
    for temperature in (1e-61, 5e-324, 1e-30):
        tiny = Sampling(temperature=temperature, top_k=3, top_p=0.9, seed=0)
        assert {tiny.pick(logits, tiny.generator(torch.device("cpu"))) for _ in range(5)} == {1}


def test_decoding_shares_the_prefill_kv_without_writing_it(make_engine):
    """The decode cache reuses the blend's K/V tensors (no copy before the first token), so
    decoding must leave them bit-identical and a second decode must give the same answer."""
    engine = make_engine()
    engine.warm(CHUNKS)
    pre = engine.prefill(chunks=CHUNKS, query="Where is the code?", recompute_ratio=0.15)
    before = [(k.clone(), v.clone()) for k, v in pre.output.kv]
    cache = pre.cache()
    assert cache.layers[0].keys.data_ptr() == pre.output.kv[0][0].data_ptr()  # shared, not copied
    first = engine.generate_from(pre, max_new_tokens=10)
    assert all(torch.equal(k, k0) and torch.equal(v, v0) for (k, v), (k0, v0) in zip(pre.output.kv, before))
    again = engine.generate_from(pre, max_new_tokens=10)
    assert again.token_ids == first.token_ids and len(first.token_ids) > 0


def test_generate_many_answers_each_prefill_as_generate_from(make_engine):
    """Five prefills (blended and full, two orders, different questions) decoded two at a time, the
    next joining when one finishes: every answer is ``generate_from``'s, token for token, with its
    finish reason and its own prefill's stats; greedy, with a stop string that ends some answers
    early, and seeded sampling (each answer its own generator, as if decoded alone)."""
    engine = make_engine()
    engine.warm(CHUNKS)
    pres = [engine.prefill(chunks=CHUNKS[::step], query=q, recompute_ratio=ratio)
            for q, step, ratio in [("Where is the code?", 1, 0.15), ("Is the clock right?", -1, 0.15),
                                   ("q", 1, 1.0), ("What hangs in the hall?", -1, 0.5), ("Why?", 1, 0.0)]]
    stop = engine.generate_from(pres[1], max_new_tokens=12).text.split()[4]  # a word mid-answer
    for options in [dict(max_new_tokens=12), dict(max_new_tokens=12, stop=[stop]),
                    dict(max_new_tokens=8, temperature=1.0, top_k=50, seed=3)]:
        alone = [engine.generate_from(p, **options) for p in pres]
        together = engine.generate_many(pres, max_batch=2, **options)
        assert [g.token_ids for g in together] == [g.token_ids for g in alone], options
        assert [g.text for g in together] == [g.text for g in alone]
        for a, b, p in zip(together, alone, pres):
            assert (a.stats.finish_reason, a.stats.completion_tokens) == (b.stats.finish_reason, b.stats.completion_tokens)
            assert a.stats.recomputed_tokens == p.stats.recomputed_tokens and a.stats.ttft_s <= a.stats.total_s
    lengths = [g.stats.completion_tokens for g in engine.generate_many(pres, max_new_tokens=12, stop=[stop])]
    assert len(set(lengths)) > 1, lengths  # answers left the batch at different steps
    assert engine.generate_many([]) == []


def test_generate_many_refuses_a_bad_batch_and_prefills_of_another_model(make_engine):
    engine, other = make_engine(), make_engine(family="qwen2")
    pre = engine.prefill(chunks=CHUNKS, query="q")
    with pytest.raises(ValueError, match="max_batch"):
        engine.generate_many([pre], max_batch=0)
    with pytest.raises(ValueError, match="same engine"):
        engine.generate_many([pre, other.prefill(chunks=CHUNKS, query="q")])
    with pytest.raises(ValueError, match="unknown generation option"):
        engine.generate_many([pre], temprature=0.5)


def test_continuation_logits_many_equal_each_prefills_own_pass(make_engine):
    """Teacher-forced passes batched by ``continuation_logits_many``: prompts of one model and one
    length (blends and full prefills, two orders, two engines over the same weights) share a
    forward, another length and another model get their own, and each result equals the prefill's
    own pass (1e-5); a full prefill's equals transformers' forward over the prompt's ids and the
    continuation (1e-4). An empty continuation gives the logits after the prompt alone."""
    from cacheblend import BlendConfig, BlendEngine
    from cacheblend.generation.decode import continuation_logits_many

    engine, other = make_engine(), make_engine(family="qwen2")
    twin = BlendEngine(engine.adapter.model, engine.tokenizer, config=engine.config)  # the same weights
    for e in (engine, twin, other):
        e.warm(CHUNKS)
    pres = [engine.prefill(chunks=CHUNKS, query="Where is the code?", recompute_ratio=1.0),
            engine.prefill(chunks=CHUNKS[::-1], query="Where is the code?", recompute_ratio=0.15),
            twin.prefill(chunks=CHUNKS, query="Where is the code?", config=BlendConfig(selector="random").with_kv_of(twin.config)),
            engine.prefill(chunks=CHUNKS[:1], query="Where?", recompute_ratio=1.0),
            other.prefill(chunks=CHUNKS, query="Where is the code?", recompute_ratio=0.15)]
    assert len({len(p.ids) for p in pres[:3]}) == 1 and len(pres[3].ids) != len(pres[0].ids)
    forced = [11, 42, 7, 99]
    many = continuation_logits_many(pres, forced)
    for p, got in zip(pres, many):
        alone = p.continuation_logits(forced)  # [5, vocab]
        assert got.shape == alone.shape == (len(forced) + 1, alone.shape[-1])
        torch.testing.assert_close(got, alone, rtol=1e-5, atol=1e-5)
    for p, got in ((pres[0], many[0]), (pres[3], many[3])):
        ids = torch.tensor([p.ids.tolist() + forced])
        with torch.inference_mode():
            want = engine.adapter.model(input_ids=ids).logits[0, len(p.ids) - 1 :].float()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert all(torch.equal(g[0], p.output.logits.float()) for g, p in zip(continuation_logits_many(pres, []), pres))
    assert not torch.allclose(many[0], many[1])  # a blend is not its full prefill: the rows are each prompt's
