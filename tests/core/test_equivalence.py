"""Equivalence proofs on tiny random models (fp32, CPU): blending at ratio 1.0 *is* a full prefill,
and a chunk computed behind the same context is exact at any ratio."""

import pytest
import torch

from cacheblend.prompts.assemble import assemble, chunk_encodings
from cacheblend.blending.blend import blend_prefill
from cacheblend.prompts.finder import Span
from cacheblend.prompts.request import PromptText
from cacheblend.prompts.tokenize import chat_header, encode_prompt
from cacheblend.blending.selection import AllSelector, DeviationSelector

from tiny_models import FAMILIES

CHUNKS = [
    "The lighthouse keeper of Varn island logged every storm since 1871 in green ink.",
    "Copper kettles were traded for salt along the northern river, two kettles per sack.",
    "In the old observatory the brass telescope points at the star the locals call Ember.",
]
QUESTION = "Question: what colour was the ink? Answer:"


def hf_reference(engine, ids: torch.Tensor):
    """Full prefill with the plain transformers model: last logits and per-layer (K, V)."""
    out = engine.adapter.model(input_ids=ids[None], use_cache=True)
    kv = [(layer.keys, layer.values) for layer in out.cache.layers]
    return out.logits[0, -1].float(), kv


def assert_kv_close(ours, reference, tol):
    """Per layer; a sliding-window layer of the reference cache keeps only its last rows."""
    for layer, ((k, v), (rk, rv)) in enumerate(zip(ours, reference)):
        rows = rk.shape[2]
        torch.testing.assert_close(k[:, :, -rows:], rk, atol=tol, rtol=tol, msg=lambda m: f"K of layer {layer}: {m}")
        torch.testing.assert_close(v[:, :, -rows:], rv, atol=tol, rtol=tol, msg=lambda m: f"V of layer {layer}: {m}")


def assembled(engine, text: PromptText):
    encoding = encode_prompt(engine.tokenizer, text.text)
    chunks = chunk_encodings(text, engine.kv.encode)
    return assemble(text, encoding, chunks, engine.kv.records([c.ids for c in chunks]), engine.adapter.device)


def blend(engine, text, schedule, selector):
    asm = assembled(engine, text)
    return asm, blend_prefill(engine.adapter, asm.input, selector, schedule)


def request(engine, order=(0, 1, 2)):
    return engine.request(chunks=[CHUNKS[i] for i in order], query=QUESTION).text


@pytest.mark.parametrize("family", FAMILIES)
def test_ratio_one_with_cached_chunks_equals_full_prefill(make_engine, family):
    engine = make_engine(family)
    engine.warm(CHUNKS)
    segments = request(engine, (2, 0, 1))
    asm, out = blend(engine, segments, {1: 1.0}, DeviationSelector("v"))
    assert asm.hits == 3 and out.recomputed == asm.input.ids.shape[0]
    logits, kv = hf_reference(engine, asm.input.ids)
    torch.testing.assert_close(out.logits, logits, atol=1e-5, rtol=1e-5)
    assert_kv_close(out.kv, kv, 1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_full_prefill_generation_matches_transformers_generate(make_engine, family):
    engine = make_engine(family)
    pre = engine.prefill(chunks=CHUNKS, query=QUESTION, recompute_ratio=1.0)
    assert pre.stats.chunk_hits == 0 and pre.stats.reused_tokens == 0
    ref = engine.adapter.model.generate(
        pre.ids[None], max_new_tokens=8, do_sample=False, attention_mask=torch.ones_like(pre.ids[None])
    )[0, len(pre.ids):].tolist()
    ids = engine.generate(chunks=CHUNKS, query=QUESTION, max_new_tokens=8, recompute_ratio=1.0).token_ids
    eos = engine.eos_ids
    expected = []
    for t in ref:
        if t in eos:
            break
        expected.append(t)
    assert ids == expected


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("ratio", [0.0, 0.15, 0.5])
def test_single_leading_chunk_behind_its_warm_context_is_exact_at_any_ratio(make_engine, family, ratio):
    engine = make_engine(family)
    engine.warm(CHUNKS[:1])
    lead = chat_header(engine.tokenizer)
    text = PromptText(lead + CHUNKS[0] + "\n\n" + QUESTION, (Span(len(lead), len(lead) + len(CHUNKS[0]), CHUNKS[0]),))
    asm, out = blend(engine, text, engine.config.with_ratio(ratio).schedule(), DeviationSelector("v"))
    assert asm.hits == 1 and asm.input.ids[: len(engine.kv.context_ids)].tolist() == engine.kv.context_ids
    logits, kv = hf_reference(engine, asm.input.ids)
    torch.testing.assert_close(out.logits, logits, atol=1e-4, rtol=1e-4)
    assert_kv_close(out.kv, kv, 1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_uncached_token_is_recomputed(make_engine, family):
    """Cached rows of uncached tokens are poisoned with NaN: if any were read instead of
    recomputed, NaN would reach the logits or the KV."""
    engine = make_engine(family)
    engine.warm([CHUNKS[0], CHUNKS[2]])  # CHUNKS[1] misses
    asm = assembled(engine, request(engine, (1, 0, 2)))
    assert (asm.hits, asm.misses) == (2, 1)
    assert asm.input.cached[:, :, :, ~asm.input.reused].eq(0).all()  # assemble zeroes what nothing covers
    asm.input.cached[:, :, :, ~asm.input.reused] = float("nan")
    for schedule in ({0: 0.0}, {1: 0.0}, {1: 0.3}, {1: 0.5, 2: 0.1}):
        out = blend_prefill(engine.adapter, asm.input, DeviationSelector("kv"), schedule)
        assert torch.isfinite(out.logits).all()
        assert all(torch.isfinite(k).all() and torch.isfinite(v).all() for k, v in out.kv)
        assert out.recomputed >= int((~asm.input.reused).sum())


def test_recompute_counts_follow_the_ratio(make_engine):
    engine = make_engine("llama")
    engine.warm(CHUNKS)
    counts = []
    for ratio in (0.0, 0.1, 0.25, 0.5, 0.75, 1.0):
        asm, out = blend(engine, request(engine), {1: ratio}, DeviationSelector("v"))
        reused = int(asm.input.reused.sum())
        uncached = asm.input.ids.shape[0] - reused
        assert out.recomputed == uncached + int(ratio * reused + 0.5)
        counts.append(out.recomputed)
    assert counts == sorted(counts) and counts[0] < counts[-1]


def test_gradual_filtering_shrinks_the_active_rows(make_engine):
    engine = make_engine("llama", check_layers=(1, 2), ratios=(0.6, 0.2))
    engine.warm(CHUNKS)
    asm, out = blend(engine, request(engine), engine.config.schedule(), DeviationSelector("v"))
    n, reused = asm.input.ids.shape[0], int(asm.input.reused.sum())
    uncached = n - reused
    assert out.active_per_layer == [
        n,
        uncached + int(0.6 * reused + 0.5),
        uncached + int(0.2 * reused + 0.5),
        uncached + int(0.2 * reused + 0.5),
    ]


def test_all_selector_at_any_ratio_is_full_prefill(make_engine):
    engine = make_engine("qwen3")
    engine.warm(CHUNKS)
    asm, out = blend(engine, request(engine, (1, 2, 0)), {2: 0.0}, AllSelector())
    logits, _ = hf_reference(engine, asm.input.ids)
    torch.testing.assert_close(out.logits, logits, atol=1e-5, rtol=1e-5)


def test_any_subset_of_chunks_may_hit(make_engine):
    engine = make_engine("llama")
    engine.warm([CHUNKS[1]])
    pre = engine.prefill(chunks=CHUNKS, query=QUESTION, recompute_ratio=0.0)
    assert (pre.stats.chunk_hits, pre.stats.chunk_misses) == (1, 2)
    assert pre.stats.reused_tokens == len(engine.kv.encode(CHUNKS[1]).ids) and pre.stats.head_tokens == 0
    again = engine.prefill(chunks=CHUNKS, query=QUESTION, recompute_ratio=0.0).stats  # the head read now
    assert again.reused_tokens == pre.stats.reused_tokens + again.head_tokens
    assert again.head_tokens == engine.request(chunks=CHUNKS, query=QUESTION).head_tokens > 0  # the missed chunk is not


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_prefix_caching_baseline_equals_full_prefill(make_engine, family):
    from cacheblend.tools.bench import PrefixCache

    engine = make_engine(family)
    ids = engine.request(chunks=CHUNKS, query=QUESTION).ids
    text = engine.request(chunks=CHUNKS, query=QUESTION).text
    head = encode_prompt(engine.tokenizer, text.text[: text.chunks[0].start]).ids
    prefix = PrefixCache(engine, head)
    pre = prefix.prefill(ids)
    logits, kv = hf_reference(engine, torch.tensor(ids))
    assert pre.stats.reused_tokens == len(head) > 0
    torch.testing.assert_close(pre.output.logits, logits, atol=1e-5, rtol=1e-5)
    assert_kv_close(pre.output.kv, kv, 1e-5)


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_warming_in_equal_length_sub_batches_matches_one_padded_batch(make_engine, family):
    """Warming runs equal-length sub-batches through the causal kernel; the result must equal the
    explicit-mask padded batch on every real row (and be zero on padding rows)."""
    from cacheblend.blending.warm_forward import forward_padded, forward_grouped

    engine = make_engine(family)
    chunks = [engine.kv.encode(c).ids for c in CHUNKS]
    chunks.append(list(chunks[0][: len(chunks[1])]))  # two chunks of the same length share a sub-batch
    ours = forward_grouped(engine.adapter, engine.kv.context_ids, chunks)
    masked = forward_padded(engine.adapter, engine.kv.context_ids, chunks)
    assert ours.shape == masked.shape
    for b, tok in enumerate(chunks):
        n = len(tok)
        torch.testing.assert_close(ours[b, ..., :n, :], masked[b, ..., :n, :], atol=1e-5, rtol=1e-5)
        assert not ours[b, ..., n:, :].any()  # forward_grouped zero-fills padding


@pytest.mark.parametrize("kv_dtype", ["float16", "float32"])
def test_selectors_compare_fresh_kv_with_the_cached_kv(make_engine, kv_dtype):
    """At a check layer the selector sees the stored K/V of each candidate, untouched by the fresh
    rows written into the layer's cache (an fp16 store is cast to a private fp32 copy, which once
    aliased the buffer the fresh V went into, and every deviation read 0)."""
    engine = make_engine("llama", kv_dtype=kv_dtype)
    engine.warm(CHUNKS)
    asm = assembled(engine, request(engine))
    stored = asm.input.cached.clone()
    seen = []

    def spy(cand, budget):
        seen.append(cand)
        return DeviationSelector("v")(cand, budget)

    blend_prefill(engine.adapter, asm.input, spy, {1: 0.15})
    (cand,) = seen
    torch.testing.assert_close(cand.cached_v, stored[1, 1][:, cand.positions].to(cand.cached_v.dtype))
    torch.testing.assert_close(cand.cached_k, stored[1, 0][:, cand.positions].to(cand.cached_k.dtype))
    assert (cand.fresh_v - cand.cached_v).abs().amax() > 1e-3
    assert torch.equal(asm.input.cached, stored)


def test_a_chunk_is_tokenized_once_and_each_caller_gets_its_own_lists(make_engine):
    """``ChunkKV.encode`` remembers a chunk's tokens: the tokenizer runs once per text, the
    remembered encoding equals the tokenizer's own, and a caller changing its lists changes
    no later call's (nor the records a prompt reads)."""
    import functools

    from cacheblend.prompts.tokenize import encode_chunk

    engine = make_engine("llama")
    calls = []
    real = engine.kv._encode
    engine.kv._encoded = functools.lru_cache(maxsize=8)(lambda t: calls.append(t) or real(t))
    first = engine.kv.encode(CHUNKS[0])
    assert first == encode_chunk(engine.tokenizer, CHUNKS[0]) and calls == [CHUNKS[0]]
    first.ids.append(-1)
    first.offsets.clear()
    again = engine.kv.encode(CHUNKS[0])
    assert again == encode_chunk(engine.tokenizer, CHUNKS[0]) and calls == [CHUNKS[0]]
    engine.warm(CHUNKS[:1])
    asm = assembled(engine, engine.request(chunks=CHUNKS[:1], query=QUESTION).text)
    assert asm.hits == 1 and calls == [CHUNKS[0]]
