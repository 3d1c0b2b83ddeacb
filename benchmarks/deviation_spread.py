"""The recomputed rows' KV deviation spread to the stale rows of their chunk, against the same blends without it.

    .venv/bin/python benchmarks/deviation_spread.py --split dev --count 60 --methods "nb1 deviation,nb1 deviation mean0.5"
    .venv/bin/python benchmarks/deviation_spread.py --quick     # 1 dev fact question, nb1 deviation with and without

At every layer from the check layer on, the blend knows, for the reused rows it recomputes, how
far their fresh K/V are from the record's (the deviation: fresh - cached, keys before RoPE). The
rows it does not recompute keep their record's K/V, though their chunk now sits behind other
passages too. If what the context changes in a chunk is partly shared by its tokens (a summary of
what precedes it, written into every row's residual stream), the recomputed rows' deviation says
something about the stale rows' as well. This script adds, to every stale row of a chunk, A times
an estimate of its deviation from the recomputed rows of the same chunk:
``mean``: their mean deviation; ``near``: their deviations weighted by exp(-distance / 8);
``glob``: as ``mean``, and a chunk with no recomputed row (beside a chunk recomputed whole, say)
takes the mean over every recomputed reused row of the prompt.
Keys are corrected before RoPE and rotated to the row's position (RoPE is linear). A chunk with no
recomputed row is left as it is; the head and the uncached rows are exact already.

It is an experiment, not a product option: it patches the blend's ``_write`` for the methods named
``"<select_eval method> <mode><A>"`` (modes ``mean``/``near``, A in ALPHAS) and runs
``select_eval.py`` with every other argument unchanged (tables, run files and the full-prefill
reference are select_eval's). In a two-stage blend the spread acts in stage 2 (stage 1 recomputes
no reused row).
Results: docs/TUNING.md (decision log: "No deviation spread").
"""

from __future__ import annotations

import sys
from dataclasses import replace

import torch

import cacheblend.blending.blend as blend_mod
import cacheblend.prefilling as prefilling
import select_eval
from cacheblend.blending.rope import apply_rope

ALPHAS = (0.15, 0.25, 0.35, 0.5, 1.0)
MODES = ("mean", "near", "glob")
BASES = ("nb1 deviation", "nb1 lexical named", "nb1 lexical+question 8%", "nb1 question", "deviation")
NEAR = 8.0  # ``near``: the distance (tokens) over which a recomputed row's weight falls by e
_by_config: dict[int, tuple[str, float]] = {}  # id(BlendConfig) of a patched method -> (mode, A)
_now: dict = {"spread": None, "inp": None, "tables": None}  # the prefill under way
_write, _blend, _tables = blend_mod._write, blend_mod._blend, blend_mod.RopeTables


def _blend_seen(model, inp, *args, **kw):
    _now["inp"] = inp  # its records and chunks, for _write below
    return _blend(model, inp, *args, **kw)


class _TablesSeen:
    """``RopeTables`` for the blend, the prompt's tables kept for _write below."""

    @staticmethod
    def at(model, pos):
        _now["tables"] = _tables.at(model, pos)
        return _now["tables"]


def _write_spread(layer_kv, k, v, rows, layer):
    _write(layer_kv, k, v, rows, layer)
    spread, inp = _now["spread"], _now["inp"]
    if spread is None or inp is None or inp.cached is None:
        return
    cached = inp.cached[layer].to(k.device)  # [2, Hkv, N, d] store dtype, keys before RoPE
    cos, sin = _now["tables"].layer(layer)  # [N, d]
    mode, alpha = spread
    reused = inp.reused  # [N]
    chunk = torch.cumsum((reused & (inp.chunk_offsets == 0)).long(), 0)  # [N]: chunk number of each reused row
    fresh = reused[rows.active]  # [n]: active rows that have a record
    src = rows.active[fresh]  # [s]
    if src.numel() == 0:
        return
    stale = reused.clone()
    stale[rows.active] = False
    dst = stale.nonzero()[:, 0]  # [t]
    if dst.numel() == 0:
        return
    dk = k[0][:, fresh] - cached[0][:, src].to(k.dtype)  # [Hkv, s, d] before RoPE
    dv = v[0][:, fresh] - cached[1][:, src].to(v.dtype)
    same = chunk[dst][:, None] == chunk[src][None, :]  # [t, s]
    if mode == "glob":  # a chunk without recomputed rows: every recomputed reused row's mean
        same = same | ~same.any(1, keepdim=True)
    w = same.to(k.dtype)
    if mode == "near":
        w = w * torch.exp(-(dst[:, None] - src[None, :]).abs().to(k.dtype) / NEAR)
    total = w.sum(1, keepdim=True)  # [t, 1]
    has = total[:, 0] > 0
    w = w[has] / total[has]
    dst = dst[has]
    if dst.numel() == 0:
        return
    est_k = torch.einsum("ts,hsd->htd", w, dk)  # [Hkv, t, d]
    est_v = torch.einsum("ts,hsd->htd", w, dv)
    layer_kv[0][:, dst] += alpha * apply_rope(est_k, cos[dst], sin[dst])
    layer_kv[1][:, dst] += alpha * est_v


def _spread_run(run):
    def wrapped(self, request, ratio=None, config=None, started=None):
        _now["spread"] = _by_config.get(id(self.config))
        try:
            return run(self, request, ratio, config, started)
        finally:
            _now["spread"] = None
    return wrapped


def register() -> None:
    """Adds ``"<base> <mode><A>"`` to select_eval's methods and patches the blend for them."""
    blend_mod._write, blend_mod._blend, blend_mod.RopeTables = _write_spread, _blend_seen, _TablesSeen
    prefilling.Prefiller.run = _spread_run(prefilling.Prefiller.run)
    for base in BASES:
        if base not in select_eval.METHODS:
            continue
        for mode in MODES:
            for alpha in ALPHAS:
                config, selector = select_eval.METHODS[base]
                config = replace(config)  # its own object: the spread is looked up by identity
                _by_config[id(config)] = (mode, alpha)
                select_eval.METHODS[f"{base} {mode}{alpha}"] = (config, selector)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    register()
    select_eval.main_with(__doc__, "nb1 deviation,nb1 deviation mean0.5", argv)


if __name__ == "__main__":
    main()
