"""The two-stage question selector (ProphetKV-style) on tiny random models.

Stage 1 is a full-reuse pass that scores every reused token by the attention the question rows
pay it across layers and heads; stage 2 recomputes the top-scored tokens (and every uncached one)
from layer 0. Checked here: ratio 1.0 is a full prefill and ratio 0.0 full reuse, bit for bit;
the tokens picked are the top-k of the fused score of a slow reference written with the plain
transformers Llama modules; stage 1 computes only the uncached rows (counted, not just reported);
every uncached row is always computed.
"""

import pytest
import torch
from transformers.models.llama.modeling_llama import rotate_half

from cacheblend import BlendConfig
from cacheblend.blending.blend import blend_prefill, budget_for
from cacheblend.blending.selection import (
    Candidates,
    DeviationSelector,
    NoneSelector,
    QuestionDeviationSelector,
    QuestionSelector,
    SinkSelector,
)
from cacheblend.blending.selectors import make_selector
from cacheblend.blending.question import Fusion, chunk_ids

from test_equivalence import CHUNKS, assembled, assert_kv_close, hf_reference, request
from tiny_models import FAMILIES


class Spy:
    """A two-stage selector that records what stage 2 hands it and what it picks (``inner``'s
    fusion and picks)."""

    two_stage = True

    def __init__(self, inner):
        self.inner, self.fusion = inner, inner.fusion
        self.seen: list[tuple[Candidates, torch.Tensor]] = []

    def __call__(self, cand, budget):
        chosen = self.inner(cand, budget)
        self.seen.append((cand, chosen))
        return chosen


def blend_input(engine, order=(1, 2, 0)):
    return assembled(engine, request(engine, order)).input


@torch.inference_mode()
def reference_stage1(engine, inp):
    """Full reuse written out with transformers' own Llama modules (eager attention over the
    realigned cached keys, fresh keys at the computed rows): per layer the attention mass
    [H, N] the question rows pay each key, and the last row's logits."""
    model = engine.adapter.model
    n = inp.ids.shape[0]
    computed = (~inp.reused).clone()
    computed[-1] = True
    rows = computed.nonzero().flatten()  # [n_c]
    last_reused = int(inp.reused.nonzero().max())
    asking = rows > min(last_reused, n - 2)  # among the computed rows
    cos, sin = model.model.rotary_emb(torch.zeros(1, dtype=torch.float32), torch.arange(n)[None])  # [1, N, d]
    cos, sin = cos[0], sin[0]
    h = model.model.embed_tokens(inp.ids[rows][None])  # [1, n_c, hidden]
    masses = []
    for layer, block in enumerate(model.model.layers):
        attn = block.self_attn
        d = attn.head_dim
        x = block.input_layernorm(h)
        q = attn.q_proj(x).view(1, -1, model.config.num_attention_heads, d).transpose(1, 2)[0]  # [H, n_c, d]
        k = attn.k_proj(x).view(1, -1, model.config.num_key_value_heads, d).transpose(1, 2)[0]
        v = attn.v_proj(x).view(1, -1, model.config.num_key_value_heads, d).transpose(1, 2)[0]
        q = q * cos[rows] + rotate_half(q) * sin[rows]
        keys = inp.cached[layer, 0].float() * cos + rotate_half(inp.cached[layer, 0].float()) * sin  # [Hkv, N, d]
        values = inp.cached[layer, 1].float().clone()
        keys[:, rows] = k * cos[rows] + rotate_half(k) * sin[rows]
        values[:, rows] = v
        group = attn.num_key_value_groups
        keys, values = keys.repeat_interleave(group, 0), values.repeat_interleave(group, 0)  # [H, N, d]
        scores = q @ keys.transpose(1, 2) * attn.scaling  # [H, n_c, N]
        causal = torch.arange(n)[None, :] <= rows[:, None]
        window = getattr(model.config, "sliding_window", None)  # Mistral's: every layer slides
        if window is not None:
            causal &= torch.arange(n)[None, :] > rows[:, None] - window
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        masses.append(probs[:, asking].sum(1))  # [H, N]
        out = (probs @ values).transpose(0, 1).reshape(1, rows.shape[0], -1)
        h = h + attn.o_proj(out)
        h = h + block.mlp(block.post_attention_layernorm(h))
    logits = model.lm_head(model.model.norm(h[:, -1]))[0]
    return torch.stack(masses), logits, int(asking.sum())  # [L, H, N]


def fused_reference(masses, selector: QuestionSelector, chunks):
    """The fusion written out plainly: heads, then layers, then per chunk."""
    num_layers = masses.shape[0]
    layers = {"all": range(num_layers), "last_third": range(num_layers - -(-num_layers // 3), num_layers),
              "last": [num_layers - 1]}[selector.layers]
    per_head = masses[list(layers)]  # [L', H, N]
    per_layer = per_head.amax(1) if selector.heads == "max" else per_head.mean(1)
    score = per_layer.mean(0)
    if selector.per_chunk:
        score = score.clone()
        for c in range(int(chunks.max()) + 1):
            mine = chunks == c
            score[mine] = score[mine] / score[mine].sum()
    return score


@pytest.mark.parametrize("family", FAMILIES)
def test_ratio_one_equals_full_prefill(make_engine, family):
    engine = make_engine(family)
    engine.warm(CHUNKS)
    inp = blend_input(engine)
    out = blend_prefill(engine.adapter, inp, QuestionSelector(), {1: 1.0})
    n = inp.ids.shape[0]
    assert out.recomputed == n and out.active_per_layer == [n] * engine.adapter.num_layers
    assert out.first_stage_rows == int((~inp.reused).sum())  # the last row is uncached here
    logits, kv = hf_reference(engine, inp.ids)
    torch.testing.assert_close(out.logits, logits, atol=1e-5, rtol=1e-5)
    assert_kv_close(out.kv, kv, 1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_ratio_zero_is_full_reuse_exactly(make_engine, family):
    engine = make_engine(family)
    engine.warm(CHUNKS)
    inp = blend_input(engine)
    reuse = blend_prefill(engine.adapter, inp, DeviationSelector("v"), {0: 0.0})
    for schedule in (BlendConfig(selector="question", ratios=(0.0,)).schedule(), {1: 0.0}, {1: 0.3, 2: 0.0}):
        out = blend_prefill(engine.adapter, inp, QuestionSelector(), schedule)
        assert torch.equal(out.logits, reuse.logits)
        assert all(torch.equal(a, b) for pa, pb in zip(out.kv, reuse.kv) for a, b in zip(pa, pb))
        assert out.active_per_layer == reuse.active_per_layer
        assert out.first_stage_rows == 0  # one pass: nothing to score


def test_reference_stage1_is_full_reuse(make_engine):
    """The slow reference below is itself right: its logits are full reuse's."""
    engine = make_engine("llama")
    engine.warm(CHUNKS)
    inp = blend_input(engine)
    _, logits, _ = reference_stage1(engine, inp)
    reuse = blend_prefill(engine.adapter, inp, NoneSelector(), {0: 0.0})
    torch.testing.assert_close(reuse.logits, logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "selector",
    [
        QuestionSelector(),
        QuestionSelector(heads="max"),
        QuestionSelector(layers="last_third"),
        QuestionSelector(layers="last"),
        QuestionSelector(per_chunk=True),
        QuestionSelector("last_third", "max", True),
    ],
    ids=lambda s: f"{s.layers}-{s.heads}-{'chunk' if s.per_chunk else 'global'}",
)
def test_picks_are_the_top_k_of_the_fused_stage1_attention(make_engine, selector):
    engine = make_engine("llama")
    engine.warm(CHUNKS)
    inp = blend_input(engine)
    masses, _, asking = reference_stage1(engine, inp)
    chunks = chunk_ids(inp.reused, inp.chunk_offsets)
    assert int(chunks.max()) == 2  # three chunks found from the offsets
    expected_score = fused_reference(masses, selector, chunks)
    spy = Spy(selector)
    ratio = 0.2
    out = blend_prefill(engine.adapter, inp, spy, {1: ratio})
    (cand, chosen), = spy.seen
    reused = inp.reused.nonzero().flatten()
    assert torch.equal(cand.positions, reused)  # every reused token is a candidate at layer 0
    torch.testing.assert_close(cand.question_score, expected_score[reused], atol=1e-5, rtol=1e-4)
    budget = budget_for(ratio, reused.numel())
    top = expected_score[reused].topk(budget).indices
    assert sorted(cand.positions[chosen].tolist()) == sorted(reused[top].tolist())
    assert out.question_rows == asking > 3
    num_layers = engine.adapter.num_layers
    assert out.question_layers == list(selector.layer_set(num_layers))


def test_picks_with_a_sliding_window(make_engine):
    """Mistral's window (48) is shorter than the prompt: the question rows see only its keys."""
    engine = make_engine("mistral")
    engine.warm(CHUNKS)
    inp = blend_input(engine)
    assert inp.ids.shape[0] > 48 + 20
    masses, logits, _ = reference_stage1(engine, inp)
    torch.testing.assert_close(blend_prefill(engine.adapter, inp, NoneSelector(), {0: 0.0}).logits, logits,
                               atol=1e-4, rtol=1e-4)
    spy = Spy(QuestionSelector())
    blend_prefill(engine.adapter, inp, spy, {1: 0.2})
    (cand, chosen), = spy.seen
    expected = fused_reference(masses, QuestionSelector(), chunk_ids(inp.reused, inp.chunk_offsets))
    torch.testing.assert_close(cand.question_score, expected[cand.positions], atol=1e-5, rtol=1e-4)
    assert (cand.question_score[cand.positions < inp.ids.shape[0] - 48 - 30] == 0).any()  # out of every window


def test_the_fusion_variants_pick_differently(make_engine):
    """The knobs are not dead: on the same prompt, the variants do not all pick the same tokens."""
    engine = make_engine("llama")
    engine.warm(CHUNKS)
    inp = blend_input(engine)
    picks = set()
    for selector in (QuestionSelector(), QuestionSelector(heads="max"), QuestionSelector(layers="last"),
                     QuestionSelector(per_chunk=True)):
        spy = Spy(selector)
        blend_prefill(engine.adapter, inp, spy, {1: 0.2})
        (cand, chosen), = spy.seen
        picks.add(tuple(sorted(cand.positions[chosen].tolist())))
    assert len(picks) >= 3


class RowCounter:
    """Counts the rows every layer computes (what passes the adapter's ``finish``: attention
    output and MLP), per call."""

    def __init__(self, adapter):
        self.rows: list[int] = []
        self._finish = adapter.finish

        def finish(layer, h, attn_out):
            self.rows.append(h.shape[1])
            return self._finish(layer, h, attn_out)

        adapter.finish = finish


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma3"])
def test_stage_one_computes_only_the_uncached_rows(make_engine, family):
    engine = make_engine(family)
    engine.warm(CHUNKS)
    inp = blend_input(engine)
    layers, reused = engine.adapter.num_layers, int(inp.reused.sum())
    uncached = inp.ids.shape[0] - reused
    counter = RowCounter(engine.adapter)
    out = blend_prefill(engine.adapter, inp, QuestionSelector(), {1: 0.15})
    stage2 = uncached + budget_for(0.15, reused)
    assert counter.rows == [uncached] * layers + [stage2] * layers  # stage 1, then stage 2 from layer 0
    assert out.first_stage_rows == uncached and [len(r) for r in out.first_stage_active] == [uncached] * layers
    assert out.active_per_layer == [stage2] * layers and out.recomputed == stage2
    # the deviation blend, for contrast: layer 0 over every row (the prelude stage 1 does not have)
    counter.rows.clear()
    blend_prefill(engine.adapter, inp, DeviationSelector("v"), {1: 0.15})
    assert counter.rows == [inp.ids.shape[0]] + [stage2] * (layers - 1)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_uncached_row_is_computed(make_engine, family):
    """Cached rows of uncached tokens are NaN: read anywhere (scores included), NaN would spread."""
    engine = make_engine(family)
    engine.warm([CHUNKS[0], CHUNKS[2]])  # CHUNKS[1] misses
    asm = assembled(engine, request(engine, (1, 0, 2)))
    assert (asm.hits, asm.misses) == (2, 1)
    inp = asm.input
    inp.cached[:, :, :, ~inp.reused] = float("nan")
    uncached = int((~inp.reused).sum())
    for ratio in (0.0, 0.15, 0.5):
        spy = Spy(QuestionSelector(heads="max", per_chunk=True))
        out = blend_prefill(engine.adapter, inp, spy, {1: ratio})
        assert torch.isfinite(out.logits).all()
        assert all(torch.isfinite(k).all() and torch.isfinite(v).all() for k, v in out.kv)
        assert out.recomputed == uncached + budget_for(ratio, int(inp.reused.sum()))
        for cand, _ in spy.seen:
            assert inp.reused[cand.positions].all() and torch.isfinite(cand.question_score).all()


def test_gradual_schedule_uses_its_last_ratio(make_engine):
    engine = make_engine("llama", check_layers=(1, 2), ratios=(0.6, 0.2), selector="question")
    engine.warm(CHUNKS)
    inp = blend_input(engine)
    reused, n = int(inp.reused.sum()), inp.ids.shape[0]
    out = blend_prefill(engine.adapter, inp, make_selector(engine.config), engine.config.schedule())
    assert out.active_per_layer == [n - reused + budget_for(0.2, reused)] * engine.adapter.num_layers


def test_engine_prefill_with_the_question_selector(make_engine):
    engine = make_engine("llama", selector="question", question_layers="last_third", question_heads="max")
    engine.warm(CHUNKS)
    engine.prefill(chunks=CHUNKS, query="Question: what colour was the ink? Answer:")  # computes the head
    pre = engine.prefill(chunks=CHUNKS, query="Question: what colour was the ink? Answer:")
    assert pre.stats.chunk_hits == 3
    stats = pre.stats
    uncached = stats.prompt_tokens - stats.hit_tokens - stats.head_tokens  # the head is read (test_head_cache.py)
    assert stats.recomputed_tokens == uncached + budget_for(0.15, stats.hit_tokens) and stats.head_tokens > 0
    # the first pass computes exactly the uncached rows (the last row is uncached: the question's)
    assert stats.first_stage_tokens == uncached > 0
    one_pass = make_engine("llama")
    one_pass.warm(CHUNKS)
    assert one_pass.prefill(chunks=CHUNKS, query="Question: what colour was the ink? Answer:").stats.first_stage_tokens == 0
    reference = engine.prefill(chunks=CHUNKS, query="Question: what colour was the ink? Answer:", recompute_ratio=1.0)
    torch.testing.assert_close(
        engine.prefill(chunks=CHUNKS, query="Question: what colour was the ink? Answer:",
                       config=engine.config.with_ratio(0.999)).output.logits,
        reference.output.logits, atol=1e-4, rtol=1e-4)


def test_sinks_on_the_question_selector(make_engine):
    engine = make_engine("llama")
    engine.warm(CHUNKS)
    inp = blend_input(engine)
    selector = make_selector(BlendConfig(selector="question", sinks=2))
    assert selector == SinkSelector(QuestionSelector(), 2) and selector.two_stage
    out = blend_prefill(engine.adapter, inp, selector, {1: 0.2})
    assert out.first_stage_rows > 0 and out.question_layers == list(range(engine.adapter.num_layers))


def test_config_names_and_validation():
    assert make_selector(BlendConfig(selector="question")) == QuestionSelector()
    made = make_selector(BlendConfig(selector="question", question_layers="last", question_heads="max",
                                     question_per_chunk=True))
    assert made == QuestionSelector("last", "max", True)
    for bad in (dict(question_layers="first"), dict(question_heads="sum"), dict(question_per_chunk=1)):
        with pytest.raises(ValueError):
            BlendConfig(selector="question", **bad)
    for bad in (dict(layers="first"), dict(heads="sum")):
        with pytest.raises(ValueError):
            QuestionSelector(**bad)
    assert QuestionSelector("last", "max", True).fusion == Fusion("last", "max", True)
    assert QuestionSelector("last_third").layer_set(30) == range(20, 30)
    assert QuestionSelector("last_third").layer_set(4) == range(2, 4)
    assert QuestionSelector("last").layer_set(4) == range(3, 4)
    with pytest.raises(ValueError, match="question_score"):
        QuestionSelector()(Candidates(1, *[torch.zeros(1, 2, 1)] * 4, torch.arange(2), torch.arange(2)), 1)


def test_chunk_ids_from_offsets():
    reused = torch.tensor([0, 1, 1, 1, 0, 1, 1, 0, 1, 1, 1, 0], dtype=torch.bool)
    offsets = torch.tensor([0, 0, 1, 3, 0, 0, 1, 0, 1, 2, 4, 0])  # holes at chunk 0 and 2 offsets 2 and 3
    assert chunk_ids(reused, offsets).tolist() == [-1, 0, 0, 0, -1, 1, 1, -1, 2, 2, 2, -1]
    assert chunk_ids(torch.zeros(3, dtype=torch.bool), torch.zeros(3, dtype=torch.long)).tolist() == [-1, -1, -1]


def test_per_chunk_fusion_gives_every_chunk_the_same_mass():
    per_layer = torch.tensor([[9.0, 1.0, 3.0, 0.5, 0.5, 5.0], [1.0, 1.0, 1.0, 0.5, 3.5, 3.0]])
    chunks = torch.tensor([-1, 0, 0, 1, 1, -1])
    score = Fusion(per_chunk=True).fuse(per_layer, chunks)
    torch.testing.assert_close(score[1:5], torch.tensor([1 / 3, 2 / 3, 0.2, 0.8]))
    torch.testing.assert_close(Fusion().fuse(per_layer, chunks), per_layer.mean(0))


class DeviationSpy:
    """The deviation selector, recording the positions it picks."""

    def __init__(self):
        self.picked = []

    def __call__(self, cand, budget):
        chosen = DeviationSelector("v")(cand, budget)
        self.picked.append(sorted(cand.positions[chosen].tolist()))
        return chosen


def test_question_deviation_at_weight_zero_is_the_deviation_blend(make_engine):
    engine = make_engine("llama")
    engine.warm(CHUNKS)
    inp = blend_input(engine)
    plain = DeviationSpy()
    reference = blend_prefill(engine.adapter, inp, plain, {1: 0.2})
    spy = Spy(QuestionDeviationSelector(0.0))
    spy.at_check_layers = True
    out = blend_prefill(engine.adapter, inp, spy, {1: 0.2})
    (cand, chosen), = spy.seen
    assert cand.layer == 1 and sorted(cand.positions[chosen].tolist()) == plain.picked[0]
    torch.testing.assert_close(out.logits, reference.logits, atol=1e-6, rtol=1e-6)
    assert out.active_per_layer == reference.active_per_layer and out.first_stage_rows > 0


def test_question_deviation_at_weight_one_picks_by_the_question(make_engine):
    engine = make_engine("llama")
    engine.warm(CHUNKS)
    inp = blend_input(engine)
    masses, _, _ = reference_stage1(engine, inp)
    score = fused_reference(masses, QuestionSelector(), chunk_ids(inp.reused, inp.chunk_offsets))
    spy = Spy(QuestionDeviationSelector(1.0))
    spy.at_check_layers = True
    blend_prefill(engine.adapter, inp, spy, {2: 0.2})
    (cand, chosen), = spy.seen
    reused = inp.reused.nonzero().flatten()
    top = score[reused].topk(budget_for(0.2, reused.numel())).indices
    assert cand.layer == 2 and sorted(cand.positions[chosen].tolist()) == sorted(reused[top].tolist())


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_question_deviation_ends(make_engine, family):
    engine = make_engine(family)
    engine.warm(CHUNKS)
    inp = blend_input(engine)
    selector = make_selector(BlendConfig(selector="question+deviation", question_weight=0.7))
    assert selector == QuestionDeviationSelector(0.7)
    full = blend_prefill(engine.adapter, inp, selector, {1: 1.0})
    logits, kv = hf_reference(engine, inp.ids)
    torch.testing.assert_close(full.logits, logits, atol=1e-5, rtol=1e-5)
    assert_kv_close(full.kv, kv, 1e-5)
    reuse = blend_prefill(engine.adapter, inp, NoneSelector(), {0: 0.0})
    out = blend_prefill(engine.adapter, inp, selector, {1: 0.0})
    assert torch.equal(out.logits, reuse.logits)
    with pytest.raises(ValueError):
        BlendConfig(selector="question+deviation", question_weight=1.5)
