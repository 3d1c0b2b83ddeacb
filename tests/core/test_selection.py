"""The query-aware selectors, sinks and fresh check-layer K/V.

Pure selector behaviour on hand-built candidates, then on tiny random models: the attention the
blend hands a query selector is the model's own attention at the check layer (checked against
transformers' eager attention), and ``fresh_check`` makes the check layer's K/V exact.
"""

import pytest
import torch

from cacheblend import BlendConfig
from cacheblend.blending.blend import blend_prefill
from cacheblend.blending.selection import (
    Candidates,
    CombinedSelector,
    DeviationSelector,
    QuerySelector,
    SinkSelector,
)
from cacheblend.blending.selectors import make_selector

from test_equivalence import CHUNKS, assembled, hf_reference, request


def candidates(deviation, attention, offsets=None) -> Candidates:
    """n candidates whose V deviation and query attention mass (1 head, 1 question row) are given."""
    n = len(deviation)
    fresh_v = torch.tensor(deviation, dtype=torch.float32).sqrt().view(1, n, 1)
    zeros = torch.zeros(1, n, 1)
    return Candidates(
        layer=1,
        fresh_k=zeros,
        fresh_v=fresh_v,
        cached_k=zeros,
        cached_v=zeros,
        positions=torch.arange(n),
        chunk_offsets=torch.tensor(offsets if offsets is not None else list(range(n))),
        query_attention=torch.tensor(attention, dtype=torch.float32).view(1, 1, n),
    )


def picked(selector, cand, budget) -> list[int]:
    return sorted(selector(cand, budget).tolist())


def test_query_selector_takes_the_most_attended_tokens():
    cand = candidates([5, 4, 3, 2, 1, 0], [0.0, 0.1, 0.5, 0.05, 0.3, 0.05])
    assert picked(QuerySelector(), cand, 2) == [2, 4]
    assert picked(DeviationSelector("v"), cand, 2) == [0, 1]


def test_query_selector_heads_mean_and_max_differ_where_one_head_dominates():
    cand = candidates([0, 0, 0], [0, 0, 0])
    # head 0 puts 0.8 on token 0; heads 1 and 2 put 0.6 each on token 1
    attention = torch.tensor([[0.8, 0.2, 0.0], [0.1, 0.6, 0.3], [0.1, 0.6, 0.3]]).view(3, 1, 3)
    cand = Candidates(**{**cand.__dict__, "query_attention": attention})
    assert picked(QuerySelector("max"), cand, 1) == [0]
    assert picked(QuerySelector("mean"), cand, 1) == [1]


def test_combined_selector_interpolates_between_deviation_and_query():
    cand = candidates([5, 4, 3, 2, 1, 0], [0.0, 0.1, 0.5, 0.05, 0.3, 0.06])
    assert picked(CombinedSelector(1.0), cand, 2) == picked(QuerySelector(), cand, 2)
    assert picked(CombinedSelector(0.0), cand, 2) == picked(DeviationSelector("v"), cand, 2)
    # ranks (deviation, query): token 1 is (4/6, 3/6), token 2 (3/6, 5/6): 2 wins at equal weight
    assert picked(CombinedSelector(0.5), cand, 1) == [2]


def test_sinks_come_first_then_the_inner_scores():
    cand = candidates([0, 9, 8, 0, 0, 7], [0] * 6, offsets=[0, 5, 6, 0, 1, 7])
    assert picked(SinkSelector(DeviationSelector("v"), 1), cand, 3) == [0, 1, 3]
    assert picked(SinkSelector(DeviationSelector("v"), 2), cand, 3) == [0, 3, 4]


def test_query_selector_without_attention_is_a_clear_error():
    cand = candidates([1, 2], [0.5, 0.5])
    with pytest.raises(ValueError, match="query_attention"):
        QuerySelector()(Candidates(**{**cand.__dict__, "query_attention": None}), 1)


def test_make_selector_and_config_validation():
    assert isinstance(make_selector(BlendConfig(selector="query")), QuerySelector)
    combined = make_selector(BlendConfig(selector="query+deviation", query_weight=0.3, sinks=2))
    assert combined == SinkSelector(CombinedSelector(0.3, "v"), 2)
    for bad in (dict(query_weight=1.5), dict(sinks=-1), dict(sinks=1.5), dict(fresh_check="yes"), dict(selector="q")):
        with pytest.raises(ValueError):
            BlendConfig(**bad)


class Recorder:
    """A real query selector that also keeps what the blend handed it."""

    needs_query = True

    def __init__(self):
        self.seen = []

    def __call__(self, cand, budget):
        self.seen.append(cand)
        return QuerySelector()(cand, budget)


def blend(engine, selector, schedule, fresh_check=False, order=(1, 2, 0)):
    asm = assembled(engine, request(engine, order))
    return asm.input, blend_prefill(engine.adapter, asm.input, selector, schedule, fresh_check)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_query_attention_is_the_models_own_attention_at_the_check_layer(make_engine, family):
    engine = make_engine(family)
    engine.warm(CHUNKS)
    recorder = Recorder()
    inp, _ = blend(engine, recorder, {1: 0.2})
    (cand,) = recorder.seen
    model = engine.adapter.model
    saved, model.config._attn_implementation = model.config._attn_implementation, "eager"
    try:
        with torch.inference_mode():
            out = model(input_ids=inp.ids[None], output_attentions=True)
    finally:
        model.config._attn_implementation = saved
    asking = torch.arange(len(inp.ids)) > int(inp.reused.nonzero().max())  # the question rows
    reference = out.attentions[1][0][:, asking][:, :, cand.positions]  # [H, m, n]
    assert cand.query_attention.shape == reference.shape and reference.shape[1] > 3
    torch.testing.assert_close(cand.query_attention, reference, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("fresh", [False, True])
def test_fresh_check_makes_the_check_layer_kv_exact(make_engine, fresh):
    engine = make_engine("llama")
    engine.warm(CHUNKS)
    inp, out = blend(engine, DeviationSelector("v"), {2: 0.15}, fresh_check=fresh)
    _, reference = hf_reference(engine, inp.ids)
    for layer in (0, 1, 2):  # layers 0-1 run a full prefill; layer 2 is the check layer
        exact = layer < 2 or fresh
        close = torch.allclose(out.kv[layer][1], reference[layer][1], atol=1e-5, rtol=1e-5)
        assert close == exact, (layer, fresh)
    assert out.recomputed < len(inp.ids)
