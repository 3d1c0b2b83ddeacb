"""The head cache (blending/head.py): the rows before a prompt's first chunk read their exact K/V,
computed once per head, and are never computed past the first check layer. Tiny random models,
fp32: with the head the blend is what it was without it (1e-5), and at ratio 1.0 still a plain
transformers forward of the tokenizer's ids."""

import pytest
import torch

from cacheblend import BlendConfig, BlendEngine
from cacheblend.blending.blend import blend_prefill
from cacheblend.blending.head import HeadCache
from cacheblend.blending.selection import DeviationSelector, NoneSelector, QuestionSelector

from test_equivalence import CHUNKS, QUESTION, assembled, hf_reference, request
from tiny_models import FAMILIES, tiny_model

TOL = 1e-5


def head_of(inp) -> int:
    return int(inp.reused.nonzero()[0])


@pytest.mark.parametrize("family", FAMILIES)
def test_ratio_one_with_the_head_is_a_full_prefill_that_skips_the_head(make_engine, family):
    engine = make_engine(family)
    engine.warm(CHUNKS)
    asm = assembled(engine, request(engine, (2, 0, 1)))
    inp, read = HeadCache().with_head(engine.adapter, asm.input, asm.input.ids.shape[0])
    head = head_of(asm.input)
    assert inp.head == head > 0 and not read  # a new cache computes it
    out = blend_prefill(engine.adapter, inp, DeviationSelector("v"), {1: 1.0})
    n = inp.ids.shape[0]
    assert out.recomputed == n - head  # every row but the head's
    assert all(int(rows.min()) == head for rows in out.active_rows[1:])  # not computed past the check layer
    logits, kv = hf_reference(engine, inp.ids)
    torch.testing.assert_close(out.logits, logits, atol=TOL, rtol=TOL)
    assert_kv_near(out.kv, kv, 2 * TOL)


def assert_kv_near(ours, reference, rel):
    """Per layer, every K and V element within ``rel`` of the layer's largest magnitude. The head's
    rows, computed alone, sum in another order than inside the whole prompt's forward: ~5e-7 on four
    families, up to 1.3e-5 on gemma3's tiny config (|K| up to ~8), which its later layers carry
    (1.2e-4 at layer 5); exact equality of the algorithm is the logits' 1e-5."""
    for layer, ((k, v), (rk, rv)) in enumerate(zip(ours, reference)):
        rows = rk.shape[2]  # a sliding-window layer of the reference cache keeps only its last rows
        for name, a, b in (("K", k[:, :, -rows:], rk), ("V", v[:, :, -rows:], rv)):
            bound = rel * float(b.detach().abs().max())
            assert float((a - b).detach().abs().max()) <= bound, f"{name} of layer {layer} off by more than {bound:.2e}"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", ["reuse", "deviation 15%", "question 15%"])
def test_the_head_changes_no_blend(make_engine, family, method):
    """At any ratio the head's K/V are what the blend computed for those rows without it (they see
    only each other), so every output is the same; only the rows computed drop by the head."""
    engine = make_engine(family)
    engine.warm(CHUNKS)
    asm = assembled(engine, request(engine, (1, 2, 0)))
    with_head, _ = HeadCache().with_head(engine.adapter, asm.input, asm.input.ids.shape[0])
    selector, schedule = {
        "reuse": (NoneSelector(), {1: 0.0}),
        "deviation 15%": (DeviationSelector("v"), {1: 0.15}),
        "question 15%": (QuestionSelector(), {1: 0.15}),
    }[method]
    plain = blend_prefill(engine.adapter, asm.input, selector, schedule)
    out = blend_prefill(engine.adapter, with_head, selector, schedule)
    torch.testing.assert_close(out.logits, plain.logits, atol=TOL, rtol=TOL)
    assert_kv_near(out.kv, plain.kv, 2 * TOL)
    head = with_head.head
    assert out.recomputed == plain.recomputed - head
    assert torch.equal(out.active_rows[-1], plain.active_rows[-1][head:])  # the same pick
    if method == "question 15%":  # stage 1 skips the head too
        assert out.first_stage_rows == plain.first_stage_rows - head


def test_engine_computes_each_head_once_and_reports_it(tokenizer):
    engine = BlendEngine(tiny_model("qwen2"), tokenizer, config=BlendConfig(kv_dtype="float32", neighbours=0))
    off = BlendEngine(engine.adapter.model, tokenizer, config=engine.config, head_bytes=0)
    engine.warm(CHUNKS)
    off.warm(CHUNKS)
    plain = off.prefill(chunks=CHUNKS, query=QUESTION)
    assert plain.stats.head_tokens == 0 and off.prefiller.heads.bytes == 0
    first = engine.prefill(chunks=CHUNKS, query=QUESTION)  # the head computed for it: counted as computed
    assert first.stats.head_tokens == 0 and first.stats.recomputed_tokens == plain.stats.recomputed_tokens
    second = engine.prefill(chunks=CHUNKS, query=QUESTION)
    heads = engine.prefiller.heads
    assert (heads.misses, heads.hits) == (1, 1)
    head = second.stats.head_tokens
    assert head == engine.request(chunks=CHUNKS, query=QUESTION).head_tokens > 0
    assert second.stats.recomputed_tokens == plain.stats.recomputed_tokens - head
    assert second.stats.reused_tokens + second.stats.recomputed_tokens == second.stats.prompt_tokens
    for pre in (first, second):
        torch.testing.assert_close(pre.output.logits, plain.output.logits, atol=TOL, rtol=TOL)
    other = engine.prefill(chunks=CHUNKS, query=QUESTION, prefix="Answer in one word.")
    assert other.stats.head_tokens == 0 and heads.misses == 2  # another system message: another head
    full = engine.prefill(chunks=CHUNKS, query=QUESTION, recompute_ratio=1.0)
    assert full.stats.head_tokens == 0 and full.stats.reused_tokens == 0  # a full prefill reads nothing
    later = engine.prefill(chunks=["A passage nobody warmed, about tides and ropes.", *CHUNKS[1:]], query=QUESTION)
    assert later.stats.head_tokens == head  # a first chunk that missed is not in the head
    loose = engine.generate("No warmed passage here, only a question: why?", max_new_tokens=1)
    assert loose.stats.head_tokens == 0 and loose.stats.reused_tokens == 0  # no chunk in it: no head


@pytest.mark.parametrize("family", FAMILIES)
def test_a_prompt_whose_chunks_all_missed_reads_its_head_and_equals_a_full_prefill(make_engine, family):
    """Prefix caching under the blend: nothing reused, the head read, every other row computed."""
    engine = make_engine(family)
    engine.warm([CHUNKS[0]])  # the head's first request
    engine.prefill(chunks=[CHUNKS[0]], query=QUESTION)
    pre = engine.prefill(chunks=CHUNKS[1:], query=QUESTION)
    s, n = pre.stats, pre.stats.prompt_tokens
    assert (s.chunk_hits, s.chunk_misses, s.hit_tokens) == (0, 2, 0)
    assert s.head_tokens == s.reused_tokens > 0 and s.recomputed_tokens == n - s.head_tokens
    assert pre.output.active_per_layer == [n - s.head_tokens] * engine.adapter.num_layers
    logits, kv = hf_reference(engine, pre.ids)
    torch.testing.assert_close(pre.output.logits, logits, atol=TOL, rtol=TOL)
    assert_kv_near(pre.output.kv, kv, 2 * TOL)


def test_the_cache_keeps_the_most_recent_heads_within_its_bytes(make_engine):
    engine = make_engine("llama")
    model = engine.adapter
    a, b, c = (torch.tensor(ids) for ids in ([1, 5, 9, 2], [1, 5, 9, 3], [1, 7, 7, 7]))
    size = HeadCache().kv(model, a)[0].numel() * 4  # fp32
    cache = HeadCache(max_bytes=2 * size)
    kv_a, hit = cache.kv(model, a)
    assert not hit and cache.kv(model, b)[1] is False
    assert cache.kv(model, a) == (kv_a, True) and cache.hits == 1  # a hit returns the kept tensor
    cache.kv(model, c)  # evicts b, the least recently used
    assert cache.bytes == 2 * size
    assert cache.kv(model, a)[0] is kv_a and cache.hits == 2
    assert cache.kv(model, b)[1] is False and cache.misses == 4  # a, b, c, then b again
    small = HeadCache(max_bytes=size - 1)
    kv, hit = small.kv(model, a)  # larger than the budget: used, not kept
    assert kv.shape[3] == 4 and small.bytes == 0 and not hit and not small.kv(model, a)[1]
    torch.testing.assert_close(kv, kv_a)
    with pytest.raises(ValueError, match="max_bytes"):
        HeadCache(max_bytes=-1)
