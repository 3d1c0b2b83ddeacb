"""The blend's grouped attention (``blending.rows.attend_rows`` with a ``RowPlan``) equals one
masked attention of the same rows over every key, for every family (sliding windows included),
with each group as one masked call and as its visible prefix and the rest merged
(``models/kernels.py``, the CPU path)."""

import pytest
import torch
import torch.nn.functional as F

import cacheblend.blending.rows as rows_module
from cacheblend.blending.rows import RowPlan, attend_rows
from cacheblend.models.kernels import attend_split, stack_heads

from tiny_models import FAMILIES


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("rows", [5, 90, 160])  # one group below 64 rows, groups above, every row
def test_grouped_rows_attend_like_one_masked_call(make_engine, monkeypatch, family, rows, split):
    adapter = make_engine(family).adapter
    assert rows_module.prefix_split(adapter.device) == (adapter.device.type == "cpu")  # the CPU kernel is there
    monkeypatch.setattr(rows_module, "prefix_split", lambda device: split)
    n, gen, dev = 160, torch.Generator().manual_seed(rows), adapter.device
    active = torch.randperm(n - 1, generator=gen)[: rows - 1].sort().values
    active = torch.cat([active, torch.tensor([n - 1])]).to(dev)  # [rows] sorted, the last row always in
    q = torch.randn(1, adapter.num_heads, rows, adapter.head_dim, generator=gen).to(dev)
    k, v = (torch.randn(1, adapter.num_kv_heads, n, adapter.head_dim, generator=gen).to(dev) for _ in range(2))
    plan, pos = RowPlan(active, n), torch.arange(n, device=dev)
    assert plan.causal == (rows == n)
    visible = [mid - lo for _, _, lo, mid, _ in plan.groups(None, split)]
    assert plan.causal or (max(visible) > 0) == split  # the split path runs where a group has a visible prefix
    windows = 0
    for layer in range(adapter.num_layers):
        windows += adapter._windows[layer] is not None
        grouped = attend_rows(adapter, layer, q, k, v, plan)  # [1, rows, H*d]
        reference = adapter._masked(q, k, v, active, pos, adapter._windows[layer], None)  # [1,H,rows,d]
        reference = reference.transpose(1, 2).reshape(1, rows, -1)
        torch.testing.assert_close(grouped, reference, atol=1e-5, rtol=1e-5, msg=f"layer {layer}")
    assert windows > 0 or family in ("llama", "qwen3")  # the window path is exercised


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_split_kernel_merges_prefix_and_rest_exactly(dtype, tol):
    """``attend_split`` on its own: GQA rows (7 query heads per K/V head, Qwen2.5's shape) over a
    visible prefix and a masked rest equal one SDPA call with the whole mask, in fp32 and bf16."""
    gen = torch.Generator().manual_seed(3)
    heads, kv_heads, d, n_keys = 14, 2, 16, 300
    pos = torch.randperm(n_keys - 120, generator=gen)[:40].sort().values + 120  # rows at 120..299
    q = torch.randn(1, heads, 40, d, generator=gen).to(dtype)
    k, v = (torch.randn(1, kv_heads, n_keys, d, generator=gen).to(dtype) for _ in range(2))
    hi, visible = int(pos[-1]) + 1, int(pos[0])
    seen = torch.arange(n_keys)[None, :hi] <= pos[:, None]  # [40, hi]
    rest = torch.zeros(40, hi - visible, dtype=dtype).masked_fill_(~seen[:, visible:], float("-inf"))
    got = attend_split(q, k[:, :, :hi], v[:, :, :hi], visible, stack_heads(rest[None, None], heads // kv_heads), 0.25)
    want = F.scaled_dot_product_attention(q.float(), k[:, :, :hi].float(), v[:, :, :hi].float(),
                                          attn_mask=seen[None, None], scale=0.25, enable_gqa=True)
    assert got.dtype == dtype and got.shape == (1, 40, heads, d)
    torch.testing.assert_close(got.float(), want.transpose(1, 2), atol=tol, rtol=tol)
