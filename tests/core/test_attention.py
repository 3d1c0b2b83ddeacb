"""The blend's grouped attention (``blending.rows.attend_rows`` with a ``RowPlan``) equals one
masked attention of the same rows over every key, for every family (sliding windows included)."""

import pytest
import torch

from cacheblend.blending.rows import RowPlan, attend_rows

from tiny_models import FAMILIES


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("rows", [5, 90, 160])  # one group below 64 rows, groups above, every row
def test_grouped_rows_attend_like_one_masked_call(make_engine, family, rows):
    adapter = make_engine(family).adapter
    n, gen, dev = 160, torch.Generator().manual_seed(rows), adapter.device
    active = torch.randperm(n - 1, generator=gen)[: rows - 1].sort().values
    active = torch.cat([active, torch.tensor([n - 1])]).to(dev)  # [rows] sorted, the last row always in
    q = torch.randn(1, adapter.num_heads, rows, adapter.head_dim, generator=gen).to(dev)
    k, v = (torch.randn(1, adapter.num_kv_heads, n, adapter.head_dim, generator=gen).to(dev) for _ in range(2))
    plan, pos = RowPlan(active, n), torch.arange(n, device=dev)
    assert plan.causal == (rows == n)
    windows = 0
    for layer in range(adapter.num_layers):
        windows += adapter._windows[layer] is not None
        grouped = attend_rows(adapter, layer, q, k, v, plan)  # [1, rows, H*d]
        reference = adapter._masked(q, k, v, active, pos, adapter._windows[layer], None)  # [1,H,rows,d]
        reference = reference.transpose(1, 2).reshape(1, rows, -1)
        torch.testing.assert_close(grouped, reference, atol=1e-5, rtol=1e-5, msg=f"layer {layer}")
    assert windows > 0 or family in ("llama", "qwen3")  # the window path is exercised
