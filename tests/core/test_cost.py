"""The MAC count behind the benchmark's attention-aware floor (tools/cost.py), checked against what
torch itself counts while the prefill runs (``FlopCounterMode``) and against the masks enumerated."""

from dataclasses import dataclass, replace

import pytest
from torch.utils.flop_counter import FlopCounterMode

from cacheblend.blending.blend import blend_prefill
from cacheblend.blending.draft import DraftSelector, draft_stage
from cacheblend.blending.selection import DeviationSelector, QuestionSelector
from cacheblend.tools.bench import compute_floor
from cacheblend.tools.cost import key_pairs, prefill_macs, prefill_rows

from tiny_models import FAMILIES
from test_equivalence import CHUNKS, assembled, request

SCHEDULES = [{}, {1: 0.0}, {1: 0.15}, {1: 0.6, 2: 0.2}]


def counted(engine, inp, schedule, selector=None):
    """The blend's output and torch's FLOP counts by op while it ran."""
    with FlopCounterMode(display=False) as counter:
        out = blend_prefill(engine.adapter, inp, selector or DeviationSelector("v"), schedule)
    return out, {str(op): flops for op, flops in counter.get_flop_counts()["Global"].items()}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_linear_macs_are_the_matmuls_torch_counts(make_engine, family, schedule):
    """Every matrix product torch counts while the prefill runs (attention's kernel aside) is a
    linear layer's: the count misses none and adds none, with or without biases and windows."""
    engine = make_engine(family)
    engine.warm(CHUNKS)
    inp = assembled(engine, request(engine, (2, 0, 1))).input
    out, flops = counted(engine, inp, schedule)
    assert set(flops) <= {"aten.mm", "aten.addmm"}
    assert sum(flops.values()) == 2 * prefill_macs(engine.adapter, out).linear


def test_a_two_stage_blend_counts_its_first_stage(make_engine):
    """The question selector's first pass (the uncached rows from layer 0, and its LM head) is
    counted too, and so is its scoring of the question's attention ([H, m, d] x [H, d, N] per
    scored layer: the batched products torch counts)."""
    engine = make_engine("llama")
    engine.warm(CHUNKS)
    inp = assembled(engine, request(engine, (2, 0, 1))).input
    out, flops = counted(engine, inp, {1: 0.15}, QuestionSelector())
    assert out.first_stage_active and out.question_rows > 0
    macs, plain = prefill_macs(engine.adapter, out), prefill_macs(engine.adapter, replace(out, question_rows=0))
    assert flops["aten.mm"] == 2 * macs.linear
    assert flops["aten.bmm"] == 2 * (macs.attention - plain.attention) > 0


@dataclass(frozen=True)
class WrongGuesses(DraftSelector):
    """The draft selector whose drafting passes guess token 0 for every next token."""

    def first_stage(self, model, inp):
        return draft_stage(model, inp, self.fusion, self.tokens, self.question, guesses=lambda draft, count: [0] * count)


@pytest.mark.parametrize("question", [False, True])
@pytest.mark.parametrize("selector", [DraftSelector, WrongGuesses])
def test_a_drafted_first_stage_counts_its_draft(make_engine, question, selector):
    """The draft selector's rows (blending/draft.py) are counted as torch counts them: each draft
    row's linear weights (its layer-0 K/V and its LM head too; a rejected guess's row's too) and the
    kept rows' scores over the prompt's keys and the draft's."""
    engine = make_engine("llama")
    engine.warm(CHUNKS)
    inp = assembled(engine, request(engine, (2, 0, 1))).input
    out, flops = counted(engine, inp, {0: 0.15}, selector("last_third", tokens=5, question=question))
    assert out.drafted == 5 and out.question_rows >= 5
    if selector is WrongGuesses:  # rows were rejected
        assert int((out.first_stage_active[0] >= inp.ids.shape[0]).sum()) > 5
    macs, plain = prefill_macs(engine.adapter, out), prefill_macs(engine.adapter, replace(out, question_rows=0, drafted=0))
    assert flops["aten.mm"] == 2 * macs.linear
    assert flops["aten.bmm"] == 2 * (macs.attention - plain.attention) > 0


def test_rows_fit_the_formula_in_one_pass_and_count_both_stages_of_two(make_engine):
    """The row floor's count: a full prefill computes every row at every layer; a one-pass blend's
    rows give exactly L / (f + (L - f) s) of it (f = 1 layer before the check layer, s the rows
    kept); a two-stage blend runs no layer-0 prelude and computes its first stage's rows at every
    layer besides the rows it recomputes, which the formula does not count."""
    engine = make_engine("llama")
    engine.warm(CHUNKS)
    inp = assembled(engine, request(engine, (2, 0, 1))).input
    n, layers = inp.ids.shape[0], engine.adapter.num_layers
    full = blend_prefill(engine.adapter, inp, DeviationSelector("v"), {})
    assert prefill_rows(full) == layers * n
    one = blend_prefill(engine.adapter, inp, DeviationSelector("v"), {1: 0.15})
    assert 0 < one.recomputed < n
    assert prefill_rows(full) / prefill_rows(one) == pytest.approx(compute_floor(layers, 1, one.recomputed / n))
    two = blend_prefill(engine.adapter, inp, QuestionSelector(), {1: 0.15})
    assert 0 < two.first_stage_rows and 0 < two.recomputed < n
    assert prefill_rows(two) == layers * (two.first_stage_rows + two.recomputed)
    assert prefill_rows(full) / prefill_rows(two) != pytest.approx(compute_floor(layers, 1, two.recomputed / n))


@pytest.mark.parametrize("family", ["llama", "gemma3"])  # gemma3's tiny model has a sliding window
def test_attention_pairs_are_the_masks_entries(make_engine, family):
    """The pairs counted per layer are the entries the attention mask lets through, enumerated
    key by key (torch's FLOP counter does not count the CPU attention kernel)."""
    engine = make_engine(family)
    engine.warm(CHUNKS)
    inp = assembled(engine, request(engine, (1, 2, 0))).input
    out, _ = counted(engine, inp, {1: 0.15})
    n, windows = inp.ids.shape[0], [engine.adapter.window(layer) for layer in range(engine.adapter.num_layers)]
    assert any(w is not None and w < n for w in windows) or family == "llama"
    for rows, window in zip(out.active_rows, windows):
        seen = sum(1 for p in rows.tolist() for k in range(n) if k <= p and (window is None or k > p - window))
        assert key_pairs(rows, window) == seen


def test_full_prefill_counts_the_causal_triangle_and_the_blend_less(make_engine):
    """Full prefill's attention is N(N+1)/2 pairs per layer; at 15% the blend counts less of
    both parts."""
    engine = make_engine("llama")
    engine.warm(CHUNKS)
    inp = assembled(engine, request(engine)).input
    full, _ = counted(engine, inp, {})
    blend, _ = counted(engine, inp, {1: 0.15})
    f, b = prefill_macs(engine.adapter, full), prefill_macs(engine.adapter, blend)
    n, layers = inp.ids.shape[0], engine.adapter.num_layers
    assert f.attention == layers * n * (n + 1) // 2 * 2 * engine.adapter.num_heads * engine.adapter.head_dim
    assert b.linear < f.linear and b.attention < f.attention
