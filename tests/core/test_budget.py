"""The adaptive recompute budget (``recompute_ratio="auto"``, blending/budget.py) on tiny random
models: with equal bounds it is the fixed ratio bit for bit, forced to a maximum of 1.0 it is a full
prefill, the ratio it picks lies within its bounds and is reported, and bad values are refused."""

import math
from dataclasses import replace

import pytest
import torch

from cacheblend import BlendConfig
from cacheblend.blending import budget
from cacheblend.blending.blend import blend_prefill, budget_for
from cacheblend.blending.selection import DeviationSelector
from cacheblend.blending.selectors import make_selector
from cacheblend.config import AutoRatio

from test_equivalence import CHUNKS, assembled, assert_kv_close, hf_reference, request


def auto(signal="deviation", lo=0.05, hi=0.3, threshold=0.0) -> AutoRatio:
    return AutoRatio(signal, lo, hi, threshold)


def same_output(a, b) -> None:
    assert a.recomputed == b.recomputed and a.active_per_layer == b.active_per_layer
    assert torch.equal(a.logits, b.logits)
    for (ka, va), (kb, vb) in zip(a.kv, b.kv):
        assert torch.equal(ka, kb) and torch.equal(va, vb)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
@pytest.mark.parametrize("ratio", [0.0, 0.15, 0.5, 1.0])
def test_auto_with_equal_bounds_is_the_fixed_ratio_bit_for_bit(make_engine, family, ratio):
    engine = make_engine(family)
    engine.warm(CHUNKS)
    asm = assembled(engine, request(engine, (2, 0, 1)))
    for signal in budget.SIGNALS:  # the check layer's (``draft_doubt`` reads a draft: below)
        got = blend_prefill(engine.adapter, asm.input, DeviationSelector("v"), {1: auto(signal, ratio, ratio)})
        fixed = blend_prefill(engine.adapter, asm.input, DeviationSelector("v"), {1: ratio})
        same_output(got, fixed)
        assert got.ratio == ratio and got.budget_signal is not None and fixed.ratio is None


def test_auto_through_the_engine_config_matches_the_fixed_prefill(make_engine):
    engine = make_engine("llama")
    engine.warm(CHUNKS)
    cfg = replace(engine.config.with_ratio("auto"), auto_min_ratio=0.15, auto_max_ratio=0.15)
    got = engine.prefill(chunks=CHUNKS, query="Which star?", config=cfg)
    fixed = engine.prefill(chunks=CHUNKS, query="Which star?", recompute_ratio=0.15)
    same_output(got.output, fixed.output)
    assert got.output.ratio == 0.15
    assert engine.prefill(chunks=CHUNKS, query="Which star?", recompute_ratio="auto").output.ratio is not None


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "gemma3"])
def test_auto_forced_to_a_maximum_of_one_is_a_full_prefill(make_engine, family):
    engine = make_engine(family)
    engine.warm(CHUNKS)
    asm = assembled(engine, request(engine, (2, 0, 1)))
    out = blend_prefill(engine.adapter, asm.input, DeviationSelector("v"), {1: auto("deviation", 0.0, 1.0, -math.inf)})
    assert out.ratio == 1.0 and out.recomputed == asm.input.ids.shape[0]
    logits, kv = hf_reference(engine, asm.input.ids)
    torch.testing.assert_close(out.logits, logits, atol=1e-5, rtol=1e-5)
    assert_kv_close(out.kv, kv, 1e-5)


@pytest.mark.parametrize("threshold", [-math.inf, 0.02, math.inf])
def test_the_chosen_ratio_lies_within_the_bounds_and_sets_the_count(make_engine, threshold):
    engine = make_engine("llama")
    engine.warm(CHUNKS)
    asm = assembled(engine, request(engine))
    spec = auto("deviation", 0.1, 0.4, threshold)
    with budget.recording() as seen:
        out = blend_prefill(engine.adapter, asm.input, DeviationSelector("v"), {1: spec})
    assert out.ratio in (0.1, 0.4) and out.ratio == spec.ratio(out.budget_signal)
    assert out.ratio == (0.4 if out.budget_signal >= threshold else 0.1)
    reused = int(asm.input.reused.sum())
    assert out.recomputed == asm.input.ids.shape[0] - reused + budget_for(out.ratio, reused)
    assert len(seen) == 1 and seen[0]["deviation"] == out.budget_signal and seen[0]["ratio"] == out.ratio


def test_the_signals_are_in_their_ranges(make_engine):
    engine = make_engine("qwen2")
    engine.warm(CHUNKS)
    asm = assembled(engine, request(engine))
    with budget.recording() as seen:
        blend_prefill(engine.adapter, asm.input, make_selector(BlendConfig()), {1: auto()})
    s = seen[0]
    assert set(budget.SIGNALS) <= set(s) and s["chunks"] == 3.0
    assert s["deviation"] > 0 and 0.15 <= s["concentration"] <= 1.0
    for name in ("attention_other", "attention_entropy", "cached_share"):
        assert 0.0 <= s[name] <= 1.0, name


def test_chunk_spread():
    chunks = torch.tensor([-1, 0, 0, 1, 1, -1])
    other, entropy = budget.chunk_spread(torch.tensor([5.0, 0.3, 0.3, 0.2, 0.2, 9.0]), chunks)
    assert other == pytest.approx(0.4) and 0.9 < entropy < 1.0
    assert budget.chunk_spread(torch.tensor([1.0, 0.5, 0.5, 0.5, 0.5, 1.0]), chunks)[1] == pytest.approx(1.0)
    assert budget.chunk_spread(torch.ones(3), torch.tensor([0, 0, -1])) == (0.0, 0.0)


def test_the_config_spells_auto_and_goes_back_to_a_fixed_ratio():
    cfg = BlendConfig().with_ratio("auto")
    assert cfg.auto_budget and isinstance(cfg.schedule()[1], AutoRatio)
    assert cfg.recompute_ratio == cfg.auto_min_ratio
    back = cfg.with_ratio(0.3)
    assert not back.auto_budget and back.schedule() == {1: 0.3}
    assert replace(cfg, auto_max_ratio=0.0, auto_min_ratio=0.0).schedule() == {0: 0.0}
    assert replace(cfg, selector="none").schedule() == {0: 0.0}


@pytest.mark.parametrize("bad", [
    dict(auto_min_ratio=-0.1), dict(auto_max_ratio=1.5), dict(auto_min_ratio=0.3, auto_max_ratio=0.2),
    dict(auto_min_ratio="0.1"), dict(auto_max_ratio=True), dict(auto_signal="entropy"), dict(auto_budget=1),
    dict(auto_threshold=float("nan")), dict(auto_budget=True, check_layers=(1, 2), ratios=(0.3, 0.15)),
    dict(auto_budget=True, selector="question"), dict(auto_budget=True, selector="draft"),
    dict(auto_budget=True, selector="deviation", auto_signal="draft_doubt"),
    dict(auto_budget=True, selector="question", auto_signal="draft_doubt"),
])
def test_bad_auto_values_raise(bad):
    with pytest.raises(ValueError):
        BlendConfig(**bad)


@pytest.mark.parametrize("ratio", ["Auto", "fast", "0.15", ""])
def test_a_ratio_string_other_than_auto_raises(ratio):
    with pytest.raises(ValueError):
        BlendConfig().with_ratio(ratio)


def test_the_engine_refuses_a_bad_ratio_string(make_engine):
    engine = make_engine("llama")
    with pytest.raises(ValueError, match="auto"):
        engine.prefill(chunks=CHUNKS[:1], query="?", recompute_ratio="fast")


def test_blend_stats_report_the_chosen_ratio(make_engine):
    engine = make_engine("llama")
    engine.warm(CHUNKS)
    cfg = replace(engine.config.with_ratio("auto"), auto_min_ratio=0.1, auto_max_ratio=0.4, auto_threshold=-math.inf)
    pre = engine.prefill(chunks=CHUNKS, query="Which star?", config=cfg)
    assert pre.output.ratio == 0.4
    assert pre.stats.recompute_ratio == 0.4 and pre.stats.budget_signal == pre.output.budget_signal


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_draft_doubt_picks_the_budget_after_the_draft(make_engine, family):
    """``auto_signal="draft_doubt"`` (``selector="draft+gap"``): the signal is 1 minus the draft's least
    sure token's margin; the blend is the fixed blend at the ratio it picks, bit for bit; a pick of 0
    is full reuse (the draft's own pass), and stats report the pick and the signal."""
    engine = make_engine(family, selector="draft+gap", draft_tokens=3, question_layers="last_third")
    engine.warm(CHUNKS)
    req = engine.request(chunks=[CHUNKS[i] for i in (2, 0, 1)], query="Which star?")
    fixed = {r: engine.prefill(req, config=engine.config.with_ratio(r)) for r in (0.0, 0.1, 0.4)}
    doubt = 1.0 - fixed[0.1].stats.draft_margin
    auto_cfg = replace(engine.config, auto_budget=True, auto_signal="draft_doubt", auto_min_ratio=0.1,
                       auto_max_ratio=0.4)
    for threshold, ratio in ((doubt - 1e-3, 0.4), (doubt + 1e-3, 0.1), (-math.inf, 0.4)):
        got = engine.prefill(req, config=replace(auto_cfg, auto_threshold=threshold))
        same_output(got.output, fixed[ratio].output)
        assert got.stats.recompute_ratio == got.output.ratio == ratio
        assert got.stats.budget_signal == pytest.approx(doubt, abs=1e-6) and fixed[ratio].output.ratio is None
    assert 1.0 - fixed[0.4].stats.draft_margin == pytest.approx(doubt, abs=1e-6)  # the same draft at any ratio
    zero = engine.prefill(req, config=replace(auto_cfg, auto_min_ratio=0.0, auto_threshold=math.inf))
    assert zero.output.ratio == 0.0 and zero.output.recomputed == fixed[0.0].output.recomputed
    torch.testing.assert_close(zero.output.logits, fixed[0.0].output.logits, atol=1e-5, rtol=1e-5)
