"""Realigned keys equal keys computed at the target positions, for every rope type we support.

Chunk KV is stored before RoPE. Running the same tokens (lead context + chunk) with every
position shifted by ``offset`` leaves the pre-RoPE states unchanged (attention sees only relative
positions), so the model's own keys at the shifted positions must equal our stored keys rotated
by the model's rotary tables at those positions: at every layer, not just the first.
"""

import pytest
import torch

from tiny_models import GEMMA3
from transformers import DynamicCache, Gemma3ForCausalLM, Gemma3TextConfig

from cacheblend import BlendConfig, BlendEngine

from cacheblend.blending.rope import RopeTables, apply_rope, realign, rotate_half

ROPES = {
    "default": None,
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
}
TEXT = "Realignment must hold for any offset: the keys are rotated by the model's own tables."


@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("offset", [0, 7, 301])
def test_realigned_keys_equal_keys_at_target_positions(make_engine, rope, offset):
    engine = make_engine("llama", rope=ROPES[rope])
    assert engine.adapter.config.rope_parameters["rope_type"] == rope
    (key,) = engine.warm([TEXT])
    stored = engine.kv.stores.get(key).kv  # [layers, 2, kv_heads, T, d], K before RoPE
    lead, n = len(engine.kv.context_ids), stored.shape[3]
    ids = torch.tensor([engine.kv.context_ids + engine.kv.encode(TEXT).ids])
    pos = torch.arange(ids.shape[1])[None] + offset
    out = engine.adapter.model(input_ids=ids, position_ids=pos, use_cache=True)
    cos, sin = engine.adapter.rope(pos[0, lead:])
    for layer, cache_layer in enumerate(out.cache.layers):
        model_keys = cache_layer.keys[0, :, lead:]  # [kv_heads, T, d] after RoPE at lead+offset..
        realigned = apply_rope(stored[layer, 0], cos, sin)
        torch.testing.assert_close(realigned, model_keys, atol=2e-5, rtol=1e-4, msg=f"layer {layer}")
        torch.testing.assert_close(stored[layer, 1], cache_layer.values[0, :, lead:], atol=2e-5, rtol=1e-4)
    assert n == len(engine.kv.encode(TEXT).ids)


@pytest.mark.parametrize("offset", [0, 301])
def test_gemma3_keys_realign_with_their_own_layer_types_geometry(tokenizer, offset):
    """Gemma 3 rotates sliding layers with base 10k and full layers with another geometry (here
    linear-scaled 1M): each layer's stored keys, rotated with its own type's tables, equal the
    model's keys at the shifted positions; the other type's tables would not.

    transformers builds Gemma's sliding mask from the position ids against cache indices, so a
    forward at shifted positions without a cached prefix would slide every key out of view: the
    window is widened past the text here (test_equivalence proves the window itself)."""
    torch.manual_seed(1234)
    model = Gemma3ForCausalLM(Gemma3TextConfig(**dict(GEMMA3, sliding_window=4096))).eval()
    engine = BlendEngine(model, tokenizer, config=BlendConfig(kv_dtype="float32", neighbours=0))
    kinds = engine.adapter.rope_kinds
    assert sorted(set(kinds)) == [0, 1] and kinds.count(kinds[-1]) == 1  # 5 sliding layers, 1 full
    (key,) = engine.warm([TEXT])
    stored = engine.kv.stores.get(key).kv  # [layers, 2, kv_heads, T, d], K before RoPE
    lead = len(engine.kv.context_ids)
    ids = torch.tensor([engine.kv.context_ids + engine.kv.encode(TEXT).ids])
    pos = torch.arange(ids.shape[1])[None] + offset
    out = engine.adapter.model(input_ids=ids, position_ids=pos, cache=DynamicCache(), use_cache=True)  # full layers
    tables = RopeTables.at(engine.adapter, pos[0, lead:])
    for layer, cache_layer in enumerate(out.cache.layers):
        model_keys = cache_layer.keys[0, :, lead:]  # [kv_heads, T, d]
        realigned = apply_rope(stored[layer, 0], *tables.layer(layer))
        torch.testing.assert_close(realigned, model_keys, atol=2e-5, rtol=1e-4, msg=f"layer {layer}")
        other = 1 - kinds[layer]
        wrong = apply_rope(stored[layer, 0], tables.cos[other], tables.sin[other])
        assert (wrong - model_keys).abs().max() > 1e-2  # the geometries differ: a shared table would fail


def test_rotate_half_and_rotation_preserve_norms():
    x = torch.randn(3, 10, 16)
    assert torch.equal(rotate_half(rotate_half(x)), -x)
    angles = torch.rand(10, 8) * 6.3
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    torch.testing.assert_close(apply_rope(x, cos, sin).norm(dim=-1), x.norm(dim=-1))
    # rotating by a then by -a is the identity
    torch.testing.assert_close(apply_rope(apply_rope(x, cos, sin), cos, -sin), x, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("store", [torch.float16, torch.bfloat16, torch.float32])
def test_realign_is_the_cast_then_apply_rope_bit_for_bit(store):
    """The blend realigns every cached layer in place after one cast;
    in fp32 it must be exactly what casting and then ``apply_rope`` give, for any store dtype."""
    gen = torch.Generator().manual_seed(0)
    cached = torch.randn(2, 3, 37, 16, generator=gen).to(store)  # [2, Hkv, N, d]
    angles = torch.rand(37, 8, generator=gen) * 300
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    out = realign(cached, cos, sin, torch.float32)
    assert out.dtype == torch.float32 and out.data_ptr() != cached.data_ptr()
    assert torch.equal(out[0], apply_rope(cached[0].float(), cos, sin))
    assert torch.equal(out[1], cached[1].float())
    roomy = realign(cached, cos, sin, torch.float32, room=5)  # room for rows after the prompt's (a draft's)
    assert roomy.shape == (2, 3, 42, 16) and torch.equal(roomy[:, :, :37], out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(37, 16), (3, 37, 16), (1, 4, 37, 64)])
def test_apply_rope_is_transformers_formula_bit_for_bit(dtype, shape):
    """``apply_rope`` skips building ``rotate_half(x)``; it must still round exactly as
    transformers' ``q * cos + rotate_half(q) * sin`` (Llama's ``apply_rotary_pos_emb``) in every
    dtype, for queries and keys of any leading shape over [T, d] tables, the input untouched."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    gen = torch.Generator().manual_seed(len(shape))
    x = (torch.randn(*shape, generator=gen) * 3).to(dtype)
    before = x.clone()
    angles = torch.rand(shape[-2], shape[-1] // 2, generator=gen) * 300
    cos, sin = (torch.cat([f(angles)] * 2, -1).to(dtype) for f in (torch.cos, torch.sin))
    while x.dim() < 4:
        x = x[None]
    ours = apply_rope(x, cos, sin)
    theirs, _ = apply_rotary_pos_emb(x, x, cos[None], sin[None])  # [B, T, d] tables, heads unsqueezed
    assert ours.dtype == theirs.dtype == dtype and torch.equal(ours, theirs)
    assert torch.equal(x.reshape(before.shape), before)
