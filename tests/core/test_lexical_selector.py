"""The lexical selector: the chunks holding the question's rarer tokens are recomputed whole.

Pure behaviour on hand-built candidates (which chunk wins, what an id every chunk holds weighs,
deviation inside and after the chosen chunks), then on tiny random models: the blend hands it
the candidates' own token ids and the question's, and at ratio 1.0 / 0.0 it is full prefill /
full reuse like every selector.
"""

from dataclasses import replace

import pytest
import torch

from cacheblend import BlendConfig, LexicalSelector
from cacheblend.blending.blend import blend_prefill
from cacheblend.blending.lexical import chunk_scores, lead_margin, named_before_blend, named_chunk, named_share
from cacheblend.blending.question import chunk_ids
from cacheblend.blending.selection import Candidates, DeviationSelector, NoneSelector
from cacheblend.blending.selectors import make_selector
from cacheblend.config import AutoRatio

from cacheblend.prompts.assemble import assemble, chunk_encodings
from cacheblend.prompts.tokenize import encode_prompt

from test_equivalence import CHUNKS, QUESTION, assembled, hf_reference, request

# three chunks; id 5 is in every chunk, 99 only in the second, 77 and 78 only in the third
IDS = [5, 11, 12, 13, 5, 99, 21, 5, 77, 78]
OFFSETS = [0, 1, 2, 3, 0, 1, 2, 0, 1, 2]
DEVIATION = [9, 8, 7, 6, 1, 3, 2, 0.5, 0.2, 0.1]  # deviation alone picks the first chunk


def candidates(question, ids=IDS) -> Candidates:
    n = len(ids)
    zeros = torch.zeros(1, n, 1)
    return Candidates(
        layer=1, fresh_k=zeros, fresh_v=torch.tensor(DEVIATION).sqrt().view(1, n, 1), cached_k=zeros,
        cached_v=zeros, positions=torch.arange(n), chunk_offsets=torch.tensor(OFFSETS),
        ids=torch.tensor(ids), question_ids=torch.tensor(question),
    )


def picked(cand, budget, selector=LexicalSelector()) -> list[int]:
    return sorted(selector(cand, budget).tolist())


def test_the_chunk_the_question_names_is_recomputed_whole_before_any_deviation():
    cand = candidates([5, 99, 1000])  # 1000: in no chunk
    assert picked(cand, 3, DeviationSelector("v")) == [0, 1, 2]
    assert picked(cand, 3) == [4, 5, 6]  # the second chunk, though its deviation is low
    assert picked(cand, 4) == [0, 4, 5, 6]  # then the highest deviation elsewhere
    assert picked(cand, 2) == [5, 6]  # a chunk that does not fit whole: by deviation inside it


def test_chunks_rank_by_the_weight_of_the_question_ids_they_hold():
    cand = candidates([99, 77, 78])  # the third chunk holds two rare ids, the second one
    assert picked(cand, 3) == [7, 8, 9]
    assert picked(cand, 6) == [4, 5, 6, 7, 8, 9]
    assert picked(cand, 7) == [0, 4, 5, 6, 7, 8, 9]  # the first chunk holds none: deviation


def test_share_caps_the_named_chunks_and_deviation_takes_the_rest():
    cand = candidates([99])
    assert picked(cand, 4, LexicalSelector(share=0.5)) == [0, 1, 5, 6]  # 2 named (by deviation inside), 2 by deviation
    assert picked(cand, 4, LexicalSelector(share=0.0)) == picked(cand, 4, DeviationSelector("v"))
    assert picked(cand, 99, LexicalSelector(share=0.5)) == list(range(len(IDS)))  # never a token twice
    assert make_selector(BlendConfig(selector="lexical", lexical_share=0.5)) == LexicalSelector("v", 0.5)
    with pytest.raises(ValueError, match="lexical_share"):
        BlendConfig(lexical_share=1.5)


def test_an_id_every_chunk_holds_weighs_nothing():
    cand = candidates([5])
    assert picked(cand, 3) == picked(cand, 3, DeviationSelector("v"))


def test_without_token_ids_it_is_a_clear_error():
    cand = candidates([99])
    with pytest.raises(ValueError, match="ids"):
        LexicalSelector()(Candidates(**{**cand.__dict__, "ids": None}), 2)
    assert make_selector(BlendConfig(selector="lexical")) == LexicalSelector("v")


class Recorder:
    """The real lexical selector, keeping what the blend handed it."""

    needs_query = False

    def __init__(self):
        self.seen = []

    def __call__(self, cand, budget):
        self.seen.append(cand)
        self.picked = LexicalSelector()(cand, budget)
        return self.picked


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_the_blend_hands_it_the_prompts_own_ids_and_the_question_rows(make_engine, family):
    engine = make_engine(family)
    engine.warm(CHUNKS)
    asm = assembled(engine, request(engine, (1, 2, 0)))
    recorder = Recorder()
    blend_prefill(engine.adapter, asm.input, recorder, {1: 0.3})
    (cand,) = recorder.seen
    inp = asm.input
    assert torch.equal(cand.ids, inp.ids[cand.positions])
    asking = torch.arange(len(inp.ids)) > int(inp.reused.nonzero().max())
    assert torch.equal(cand.question_ids, inp.ids[asking]) and cand.question_ids.numel() > 3


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_ratio_one_is_full_prefill_and_zero_is_full_reuse(make_engine, family):
    engine = make_engine(family)
    engine.warm(CHUNKS)
    inp = assembled(engine, request(engine, (2, 0, 1))).input
    selector = make_selector(BlendConfig(selector="lexical"))
    full = blend_prefill(engine.adapter, inp, selector, {1: 1.0})
    logits, _ = hf_reference(engine, inp.ids)
    torch.testing.assert_close(full.logits.float(), logits, atol=1e-4, rtol=1e-4)
    none = blend_prefill(engine.adapter, inp, selector, {1: 0.0})
    reuse = blend_prefill(engine.adapter, inp, NoneSelector(), {1: 0.0})
    assert torch.equal(none.logits, reuse.logits) and none.recomputed == reuse.recomputed


def test_named_share_is_the_share_of_the_chunk_the_question_names_most():
    ids, chunk = torch.tensor(IDS), torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
    assert named_share(ids, chunk, torch.tensor([5, 77, 78, 99])) == pytest.approx(0.3)  # the third chunk: two ids
    assert named_share(ids, torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1, 1]), torch.tensor([11])) == pytest.approx(0.6)
    assert named_share(ids, chunk, torch.tensor([5])) == 0.0  # an id every chunk holds names none
    assert named_share(ids, chunk, torch.tensor([1000])) == 0.0


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_the_named_share_budget_recomputes_exactly_the_named_chunk_whole(make_engine, family):
    """``auto_signal="named_share"``: the ratio is the named chunk's share of the reused tokens,
    and the lexical selector spends it on that chunk, every token of it and nothing else."""
    engine = make_engine(family)
    engine.warm(CHUNKS)
    inp = assembled(engine, request(engine, (1, 2, 0))).input  # "what colour was the ink?": the last chunk
    recorder = Recorder()
    out = blend_prefill(engine.adapter, inp, recorder, {1: AutoRatio("named_share", 0.0, 1.0, 0.0)})
    (cand,) = recorder.seen
    chunk = chunk_ids(torch.ones_like(cand.chunk_offsets, dtype=torch.bool), cand.chunk_offsets)
    scores = chunk_scores(cand.ids, chunk, cand.question_ids)
    assert float(scores.max()) > 0 and int(scores.argmax()) == 2  # the ink chunk, third in this prompt
    reused = int(inp.reused.sum())
    named = (chunk == 2).nonzero().flatten()
    assert out.ratio == pytest.approx(named.numel() / reused) and out.budget_signal == out.ratio
    assert sorted(recorder.picked.tolist()) == named.tolist()
    assert out.recomputed == inp.ids.shape[0] - reused + named.numel()
    bounded = blend_prefill(engine.adapter, inp, LexicalSelector(), {1: AutoRatio("named_share", 0.0, 0.1, 0.0)})
    assert bounded.ratio == 0.1  # within the bounds


def test_the_first_chunk_read_alone_is_named_by_no_question():
    """Full prefill computes the prompt's first passage behind the prompt's head only, as its KV
    warmed alone was: a question naming it names nothing recomputing helps (``first_alone``), so
    the named share is 0 and the lexical selector spends the budget by deviation. Any other
    chunk named stays named."""
    ids, chunk = torch.tensor(IDS), torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
    first = torch.tensor([11, 12])  # only the first chunk holds them
    assert named_chunk(chunk_scores(ids, chunk, first)) == 0
    assert named_chunk(chunk_scores(ids, chunk, first), first_alone=True) is None
    assert named_share(ids, chunk, first) == pytest.approx(0.4)
    assert named_share(ids, chunk, first, first_alone=True) == 0.0
    assert named_share(ids, chunk, torch.tensor([99]), first_alone=True) == pytest.approx(0.3)
    assert named_chunk(chunk_scores(ids, chunk, torch.tensor([5])), first_alone=False) is None  # names none
    low_first = torch.tensor(DEVIATION[::-1]).sqrt().view(1, len(IDS), 1)  # deviation alone picks the last chunk
    named = Candidates(**{**candidates([11, 12]).__dict__, "fresh_v": low_first})
    alone = Candidates(**{**named.__dict__, "first_alone": True})
    assert picked(named, 4) == [0, 1, 2, 3]
    assert picked(alone, 4) == picked(alone, 4, DeviationSelector("v")) == [6, 7, 8, 9]
    second = Candidates(**{**candidates([99]).__dict__, "first_alone": True})
    assert picked(second, 3) == [4, 5, 6]  # the second chunk named: whole, as without the flag


def test_tied_chunks_name_the_first_and_the_budget_and_the_rows_agree():
    """A question naming two chunks alike (99 only in the second, 77 only in the third) names the
    first of them in ``named_chunk``, ``named_share`` and the selector alike: the budget sized for
    one chunk is spent on that chunk, every token of it, though the selector's ranking of chunks
    by score alone would put the later first. A tie that the first chunk read alone leads names
    none: the budget is the lower bound's and the selector's is deviation's."""
    ids, chunk = torch.tensor(IDS), torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
    tied = torch.tensor([99, 77])
    scores = chunk_scores(ids, chunk, tied)
    assert scores[1] == scores[2] > scores[0]
    for alone in (False, True):
        assert named_chunk(scores, first_alone=alone) == 1
        assert named_share(ids, chunk, tied, first_alone=alone) == pytest.approx(0.3)
        cand = Candidates(**{**candidates([99, 77]).__dict__, "first_alone": alone})
        assert picked(cand, 3) == [4, 5, 6]  # the second chunk whole
    first = torch.tensor([11, 77])  # the first chunk and the third alike
    assert named_chunk(chunk_scores(ids, chunk, first)) == 0
    assert picked(candidates([11, 77]), 4) == [0, 1, 2, 3]
    assert named_chunk(chunk_scores(ids, chunk, first), first_alone=True) is None
    assert named_share(ids, chunk, first, first_alone=True) == 0.0
    alone = Candidates(**{**candidates([11, 77]).__dict__, "first_alone": True})
    assert picked(alone, 3) == picked(alone, 3, DeviationSelector("v"))


def test_assemble_says_first_alone_only_when_the_first_chunk_is_read(make_engine):
    engine = make_engine("llama")
    engine.warm(CHUNKS)
    text = request(engine, (0, 1, 2))
    encoding, chunks = encode_prompt(engine.tokenizer, text.text), chunk_encodings(text, engine.kv.encode)
    records = engine.kv.records([c.ids for c in chunks])
    device = engine.adapter.device
    assert assemble(text, encoding, chunks, records, device, first_alone=True).input.first_alone
    assert not assemble(text, encoding, chunks, records, device).input.first_alone
    missed = assemble(text, encoding, chunks, [None, *records[1:]], device, first_alone=True)
    assert missed.misses == 1 and not missed.input.first_alone  # the first reused chunk is the prompt's second


@pytest.mark.parametrize("lead_alone", [True, False])
def test_the_named_budget_skips_the_first_chunk_when_its_kv_was_warmed_alone(make_engine, lead_alone):
    """An engine warming behind neighbours with lead records reads the prompt's first chunk warmed
    alone: a question naming it gets the lower bound; without lead records (every chunk behind
    its neighbour) or with the named chunk second, the named chunk's share."""
    low, high = 0.05, 0.9
    engine = make_engine("llama", neighbours=1, lead_alone=lead_alone, selector="lexical", auto_budget=True,
                         auto_signal="named_share", auto_min_ratio=low, auto_max_ratio=high)
    engine.warm(CHUNKS)
    first = engine.prefill(chunks=CHUNKS, query=QUESTION).stats  # "what colour was the ink?": CHUNKS[0]
    second = engine.prefill(chunks=[CHUNKS[1], CHUNKS[0], CHUNKS[2]], query=QUESTION).stats
    assert first.chunk_hits == second.chunk_hits == 3
    ink = len(engine.kv.encode(CHUNKS[0]).ids)
    assert second.recompute_ratio == pytest.approx(ink / second.hit_tokens, abs=2 / second.hit_tokens)  # edge tokens
    if lead_alone:
        # (+ head_tokens: the first request computed the prompt's head, the second read it)
        assert first.recompute_ratio == low
        assert first.recomputed_tokens + first.head_tokens < second.recomputed_tokens + second.head_tokens
    else:
        assert first.recompute_ratio == pytest.approx(ink / first.hit_tokens, abs=2 / first.hit_tokens)


def test_lead_after_named_reads_the_lead_records_of_the_chunks_after_the_named_one(make_engine):
    """With ``lead_after_named`` the records read are: the first chunk's and every chunk's after
    the named one lead records, the named one's and those between their neighbour-warmed ones. The
    blend is then exactly the one over those records picked by hand, and not the default's."""
    engine = make_engine("llama", neighbours=1, selector="lexical", auto_budget=True, auto_signal="named_share")
    engine.warm(CHUNKS)
    order = [CHUNKS[1], CHUNKS[0], CHUNKS[2]]  # the question names CHUNKS[0], second here
    on = replace(engine.config, lead_after_named=True)
    got = engine.prefill(chunks=order, query=QUESTION, config=on)
    default = engine.prefill(chunks=order, query=QUESTION)

    def by_hand(chunks, lead_from=None, lead_weight=1.0):
        keys = [engine.kv.record_keys(ids) for ids in chunks]
        return [engine.kv.stores.get(lead if i in (0, 2) else plain) for i, (plain, lead) in enumerate(keys)]

    from cacheblend.prefilling import Prefiller
    hand = Prefiller(engine.adapter, engine.kv.encode, by_hand, engine.config).run(engine.request(chunks=order, query=QUESTION))
    computed = lambda s: s.recomputed_tokens + s.head_tokens  # noqa: E731: a head read counts as computed
    assert got.stats.chunk_hits == 3 and computed(got.stats) == computed(default.stats)
    torch.testing.assert_close(got.output.logits, hand.output.logits, atol=0, rtol=0)
    assert not torch.equal(got.output.logits, default.output.logits)
    last = engine.prefill(chunks=[CHUNKS[1], CHUNKS[2], CHUNKS[0]], query=QUESTION, config=on)  # named last: none after it
    plain = engine.prefill(chunks=[CHUNKS[1], CHUNKS[2], CHUNKS[0]], query=QUESTION)
    assert torch.equal(last.output.logits, plain.output.logits)


def test_lead_after_named_half_way_reads_the_mean_of_each_chunks_two_records(make_engine):
    """``lead_after_named=0.5``: the chunks after the named one read the mean of their
    neighbour-warmed and lead records (computed in fp32, kept in the records' dtype); the blend is
    exactly the one over those records built by hand, neither of the two others; records of
    different shapes (not one chunk's) are refused."""
    engine = make_engine("llama", neighbours=1, selector="lexical", auto_budget=True, auto_signal="named_share")
    engine.warm(CHUNKS)
    order = [CHUNKS[1], CHUNKS[0], CHUNKS[2]]  # the question names CHUNKS[0], second here
    got = engine.prefill(chunks=order, query=QUESTION, config=replace(engine.config, lead_after_named=0.5))
    lead = engine.prefill(chunks=order, query=QUESTION, config=replace(engine.config, lead_after_named=True))
    plain = engine.prefill(chunks=order, query=QUESTION)

    def by_hand(chunks, lead_from=None, lead_weight=1.0):
        keys = [engine.kv.record_keys(ids) for ids in chunks]
        out = [engine.kv.stores.get(lead if i == 0 else near) for i, (near, lead) in enumerate(keys)]
        near, far = engine.kv.stores.get(keys[2][0]), engine.kv.stores.get(keys[2][1])
        mean = (far.kv.float() + 0.5 * (near.kv.float() - far.kv.float())).to(near.kv.dtype)
        assert not torch.equal(mean, near.kv) and not torch.equal(mean, far.kv)
        out[2] = type(near)(near.key, mean, near.text)
        return out

    from cacheblend.prefilling import Prefiller
    hand = Prefiller(engine.adapter, engine.kv.encode, by_hand, engine.config).run(engine.request(chunks=order, query=QUESTION))
    computed = lambda s: s.recomputed_tokens + s.head_tokens  # noqa: E731: a head read counts as computed
    assert got.stats.chunk_hits == 3 and computed(got.stats) == computed(plain.stats)
    torch.testing.assert_close(got.output.logits, hand.output.logits, atol=0, rtol=0)
    assert not torch.equal(got.output.logits, lead.output.logits) and not torch.equal(got.output.logits, plain.output.logits)
    near = engine.kv.stores.get(engine.kv.record_keys(engine.kv.encode(CHUNKS[2]).ids)[0])
    with pytest.raises(ValueError, match="one shape"):
        near.toward(type(near)(near.key, near.kv[:, :, :, :-1], near.text), 0.5)


def test_lead_margin_is_the_named_chunks_lead_over_the_next_as_a_share_of_its_score():
    assert lead_margin(torch.tensor([0.0, 3.0, 1.0])) == pytest.approx(2 / 3)
    assert lead_margin(torch.tensor([2.0, 0.5, 2.0])) == 0.0  # a tie
    assert lead_margin(torch.tensor([0.0, 0.0, 4.0])) == 1.0  # one chunk alone holds the question's ids
    assert lead_margin(torch.tensor([5.0])) == 1.0 and lead_margin(torch.tensor([])) == 0.0
    assert lead_margin(torch.zeros(3)) == 0.0  # names none
    chunks = [[1, 2], [99, 5, 7], [5, 8], [77]]  # 99 only in the second, 5 in the second and third
    # second: log 4 + log 2, third: log 2 -> margin log 4 / (log 4 + log 2) = 2/3
    assert named_before_blend(chunks, [99, 5], margin=0.66) == 1
    assert named_before_blend(chunks, [99, 5], margin=0.67) is None
    assert named_before_blend(chunks, [99, 5]) == 1
    assert named_before_blend([[9], [99], [99]], [99]) == 1  # tied: the first of them, with no margin asked
    assert named_before_blend([[9], [99], [99]], [99], margin=0.01) is None  # tied: gated out


def test_lead_after_margin_gates_the_lead_records_by_the_named_chunks_lead(make_engine):
    """``lead_after_margin``: the chunks after the named one read their lead records only where the
    named chunk's score leads the next chunk's by at least the margin; below it the blend is the
    default's, bit for bit, and at or above it ``lead_after_named``'s. The prompt's margin is read
    from its own chunk and question ids (the text after the last chunk, tokenized as chunks are)."""
    engine = make_engine("llama", neighbours=1, selector="lexical", auto_budget=True, auto_signal="named_share")
    engine.warm(CHUNKS)
    order = [CHUNKS[1], CHUNKS[0], CHUNKS[2]]  # the question names CHUNKS[0], second here
    req = engine.request(chunks=order, query=QUESTION)
    tail = req.text.text[req.text.chunks[-1].end:]
    ids = [list(engine.kv.encode(c).ids) for c in order]
    flat = torch.tensor([t for c in ids for t in c])
    chunk = torch.tensor([i for i, c in enumerate(ids) for _ in c])
    margin = lead_margin(chunk_scores(flat, chunk, torch.tensor(engine.kv.encode(tail).ids)))
    assert 0 < margin < 1, margin  # another chunk holds one of the question's ids
    lead = engine.prefill(chunks=order, query=QUESTION, config=replace(engine.config, lead_after_named=True))
    plain = engine.prefill(chunks=order, query=QUESTION)
    assert not torch.equal(lead.output.logits, plain.output.logits)
    for gate, expect in ((margin, lead), (min(1.0, margin + 0.01), plain), (1.0, plain)):
        cfg = replace(engine.config, lead_after_named=True, lead_after_margin=gate)
        got = engine.prefill(chunks=order, query=QUESTION, config=cfg)
        assert torch.equal(got.output.logits, expect.output.logits), gate


def test_lead_after_named_needs_the_lexical_selector_and_lead_records():
    for bad in (dict(), dict(selector="lexical", lead_alone=False), dict(selector="lexical", neighbours=0)):
        with pytest.raises(ValueError, match="lead_after_named"):
            BlendConfig(lead_after_named=True, **bad)
    for bad in (-0.1, 1.5, "half", float("nan")):
        with pytest.raises(ValueError, match="lead_after_named"):
            BlendConfig(selector="lexical", lead_after_named=bad)
    assert BlendConfig(selector="lexical", lead_after_named=True).lead_after_named == 1.0
    assert BlendConfig(selector="lexical", lead_after_named=0.5).lead_after_named == 0.5
    assert BlendConfig(lead_after_named=False).lead_after_named == 0.0
    for bad in (-0.1, 1.5, "half", float("nan"), True):
        with pytest.raises(ValueError, match="lead_after_margin"):
            BlendConfig(selector="lexical", lead_after_named=True, lead_after_margin=bad)
    with pytest.raises(ValueError, match="lead_after_margin"):  # a gate on nothing
        BlendConfig(selector="lexical", lead_after_margin=0.5)
    assert BlendConfig(selector="lexical", lead_after_named=0.5, lead_after_margin=0.4).lead_after_margin == 0.4
