"""Rows that join the blend at a later layer from a kept residual stream (``BlendInput.restart``):
given the residual stream a plain transformers full prefill computes, they make the blend exact."""

from dataclasses import replace

import pytest
import torch

from cacheblend.blending.blend import blend_prefill
from cacheblend.blending.inputs import Restart
from cacheblend.blending.selection import DeviationSelector

from test_equivalence import CHUNKS, assembled, assert_kv_close, hf_reference, request
from tiny_models import FAMILIES


def reference_hidden(engine, ids: torch.Tensor, layer: int) -> torch.Tensor:
    """[N, hidden]: what enters ``layer`` in a plain transformers forward of ``ids``."""
    with torch.inference_mode():
        out = engine.adapter.model(input_ids=ids[None], output_hidden_states=True)
    return out.hidden_states[layer][0]


@pytest.mark.parametrize("family", FAMILIES)
def test_every_reused_row_restarted_at_layer_one_from_full_prefill_is_full_prefill(make_engine, family):
    """Check layer 0 keeps no reused row, so layer 0 reads the cached K/V (a chunk's layer-0 K/V
    depend on its own tokens only: exact); at layer 1 every reused row joins with the residual
    stream full prefill has there, so from then on the blend computes what full prefill computes."""
    engine = make_engine(family)
    engine.warm(CHUNKS)
    inp = assembled(engine, request(engine, (2, 0, 1))).input
    reused = inp.reused.nonzero().flatten()
    hidden = reference_hidden(engine, inp.ids, 1)
    out = blend_prefill(engine.adapter, replace(inp, restart=Restart(1, reused, hidden[reused])),
                        DeviationSelector("v"), {0: 0.0})
    n = inp.ids.shape[0]
    assert out.active_per_layer[0] == n - reused.numel() and out.active_per_layer[1:] == [n] * (engine.adapter.num_layers - 1)
    logits, kv = hf_reference(engine, inp.ids)
    torch.testing.assert_close(out.logits, logits, atol=1e-4, rtol=1e-4)
    assert_kv_close(out.kv, kv, 1e-4)

    # the hidden states go to their own rows: handed over one row off, the result is not full prefill's
    wrong = blend_prefill(engine.adapter, replace(inp, restart=Restart(1, reused, hidden[reused].roll(1, 0))),
                          DeviationSelector("v"), {0: 0.0})
    assert not torch.allclose(wrong.logits, logits, atol=1e-3, rtol=1e-3)


def test_rows_already_recomputed_keep_their_own_hidden_state(make_engine):
    """A restarted row the selector recomputes from the check layer on keeps what it computed:
    restarting the rows a ratio-1.0 blend computes anyway changes nothing, whatever their hidden state."""
    engine = make_engine("llama")
    engine.warm(CHUNKS)
    inp = assembled(engine, request(engine)).input
    reused = inp.reused.nonzero().flatten()
    plain = blend_prefill(engine.adapter, inp, DeviationSelector("v"), {1: 1.0})
    garbage = torch.full((reused.numel(), engine.adapter.config.hidden_size), 1e3)
    out = blend_prefill(engine.adapter, replace(inp, restart=Restart(2, reused, garbage)), DeviationSelector("v"), {1: 1.0})
    assert torch.equal(out.logits, plain.logits)
    assert out.active_per_layer == plain.active_per_layer


def test_a_restart_before_the_selection_is_refused(make_engine):
    engine = make_engine("llama")
    engine.warm(CHUNKS)
    inp = assembled(engine, request(engine)).input
    reused = inp.reused.nonzero().flatten()
    restart = Restart(1, reused, torch.zeros(reused.numel(), engine.adapter.config.hidden_size))
    with pytest.raises(ValueError, match="after the first check layer"):
        blend_prefill(engine.adapter, replace(inp, restart=restart), DeviationSelector("v"), {1: 0.15})
