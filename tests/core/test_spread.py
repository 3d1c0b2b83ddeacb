"""Deviation spread (``BlendConfig.spread``, ``blending/spread.py``): a chunk's stale rows move by a
share of the mean deviation its recomputed rows showed, and nothing else changes."""

from dataclasses import replace

import pytest
import torch

from cacheblend import BlendConfig
from cacheblend.blending.blend import blend_prefill
from cacheblend.blending.rope import RopeTables, apply_rope
from cacheblend.blending.selection import DeviationSelector
from cacheblend.blending.spread import DeviationSpread, chunk_numbers

from test_equivalence import CHUNKS, QUESTION, assembled, request
from tiny_models import FAMILIES


def test_chunk_numbers_count_chunks_in_prompt_order():
    reused = torch.tensor([0, 1, 1, 1, 0, 1, 1, 1, 1, 0], dtype=torch.bool)
    offsets = torch.tensor([0, 0, 1, 2, 0, 0, 1, 0, 1, 0])  # three chunks: 1-3, 5-6, 7-8
    assert chunk_numbers(reused, offsets).tolist() == [-1, 0, 0, 0, -1, 1, 1, 2, 2, -1]


def test_spread_moves_stale_rows_by_their_chunks_mean_deviation_by_hand():
    """Two chunks: the first has recomputed rows 1 and 2 (deviations +1 and +3 in V, mean +2), the
    second none. With alpha 0.5 and RoPE at angle 0 (cos 1, sin 0): the first chunk's stale row 3
    moves by 1.0 in K and V; the recomputed rows, the second chunk and the uncached row stay."""
    n, d = 7, 4
    chunks = torch.tensor([-1, 0, 0, 0, 1, 1, 1])
    cached = torch.zeros(2, 1, n, d)
    layer_kv = torch.zeros(2, 1, n, d)
    active = torch.tensor([0, 1, 2])  # the uncached row 0 and two rows of chunk 0
    fresh = torch.tensor([[5.0], [1.0], [3.0]]).expand(3, d)[None, None]  # [1, 1, 3, d]
    layer_kv[:, :, active] = fresh[0]  # what _write put there
    cos, sin = torch.ones(n, d), torch.zeros(n, d)
    DeviationSpread(chunks, 0.5).apply(layer_kv, (fresh, fresh), active, cached, (cos, sin))
    expected = torch.tensor([5.0, 1.0, 3.0, 1.0, 0.0, 0.0, 0.0])[:, None].expand(n, d)
    for part in (0, 1):
        torch.testing.assert_close(layer_kv[part, 0], expected, rtol=0, atol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_stale_rows_carry_the_share_of_their_chunks_mean_deviation_at_every_layer(make_engine, family):
    """Read back from the blend's own output: at every layer from the check layer on, each reused
    row not recomputed holds its record plus 0.5 x the mean of (fresh - record) over the recomputed
    rows of its chunk, in V and in K before RoPE; the recomputed rows and the rows before the check
    layer are what they would be without a spread computed over these caches; a chunk without a
    recomputed row keeps its record."""
    engine = make_engine(family)
    engine.warm(CHUNKS)
    inp = assembled(engine, request(engine, (2, 0, 1))).input
    out = blend_prefill(engine.adapter, inp, DeviationSelector("v"), {1: 0.3}, spread=0.5)
    plain = blend_prefill(engine.adapter, inp, DeviationSelector("v"), {1: 0.3})
    chunks = chunk_numbers(inp.reused, inp.chunk_offsets)
    tables = RopeTables.at(engine.adapter, torch.arange(inp.ids.shape[0]))
    torch.testing.assert_close(out.kv[0][1], plain.kv[0][1], rtol=0, atol=0)  # layer 0: before the check
    assert out.active_per_layer == plain.active_per_layer
    moved = 0
    for layer in range(1, engine.adapter.num_layers):
        cos, sin = tables.layer(layer)
        unrotated = apply_rope(out.kv[layer][0][0], cos, -sin)  # [Hkv, N, d] keys before RoPE
        record = inp.cached[layer].float()  # [2, Hkv, N, d]
        active = out.active_rows[layer]
        for c in range(int(chunks.max()) + 1):
            rows = (chunks == c).nonzero()[:, 0]
            fresh = rows[torch.isin(rows, active)]
            stale = rows[~torch.isin(rows, active)]
            for part, got in ((0, unrotated), (1, out.kv[layer][1][0])):
                shift = 0.0  # a chunk with no recomputed row keeps its record
                if fresh.numel():
                    shift = 0.5 * (got[:, fresh] - record[part][:, fresh]).mean(1, keepdim=True)  # [Hkv, 1, d]
                torch.testing.assert_close(got[:, stale], record[part][:, stale] + shift, rtol=1e-4, atol=1e-4)
            moved += int(fresh.numel() > 0 and stale.numel() > 0)
    assert moved > 0  # some chunk had both kinds of rows
    assert not torch.allclose(out.logits, plain.logits)


@pytest.mark.parametrize("schedule", [{1: 0.0}, {1: 1.0}])
def test_with_nothing_or_everything_recomputed_there_is_nothing_to_spread(make_engine, schedule):
    """Full reuse recomputes no reused row (no deviation known); ratio 1.0 leaves no stale row."""
    engine = make_engine("llama")
    engine.warm(CHUNKS)
    inp = assembled(engine, request(engine)).input
    out = blend_prefill(engine.adapter, inp, DeviationSelector("v"), schedule, spread=1.0)
    plain = blend_prefill(engine.adapter, inp, DeviationSelector("v"), schedule)
    assert torch.equal(out.logits, plain.logits)


def test_the_engine_passes_its_spread_to_the_blend(make_engine):
    engine = make_engine("llama")
    engine.warm(CHUNKS)
    ask = dict(chunks=[CHUNKS[i] for i in (2, 0, 1)], query=QUESTION)
    engine.prefill(**ask)  # the first request computes the prompt's head; later ones read it
    plain = engine.prefill(**ask)
    spread = engine.prefill(**ask, config=replace(engine.config, spread=0.25))
    assert spread.stats.recomputed_tokens == plain.stats.recomputed_tokens
    assert not torch.allclose(spread.output.logits, plain.output.logits)


@pytest.mark.parametrize("bad", [-0.1, 1.5, "0.2", True, float("nan")])
def test_a_spread_outside_zero_to_one_is_refused(bad):
    with pytest.raises(ValueError, match="spread"):
        BlendConfig(spread=bad)
