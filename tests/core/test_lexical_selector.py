"""The lexical selector: the chunks holding the question's rarer tokens are recomputed whole.

Pure behaviour on hand-built candidates (which chunk wins, what an id every chunk holds weighs,
deviation inside and after the chosen chunks), then on tiny random models: the blend hands it
the candidates' own token ids and the question's, and at ratio 1.0 / 0.0 it is full prefill /
full reuse like every selector.
"""

import pytest
import torch

from cacheblend import BlendConfig, LexicalSelector
from cacheblend.blending.blend import blend_prefill
from cacheblend.blending.lexical import chunk_scores, named_share
from cacheblend.blending.question import chunk_ids
from cacheblend.blending.selection import Candidates, DeviationSelector, NoneSelector
from cacheblend.blending.selectors import make_selector
from cacheblend.config import AutoRatio

from test_equivalence import CHUNKS, assembled, hf_reference, request

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
