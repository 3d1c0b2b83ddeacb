"""Recomputing stale rows from a later layer: the residual stream kept at warm time (research, stop 46).

    .venv/bin/python benchmarks/restart_depth.py --model qwen2.5-0.5b-instruct --split dev --count 60 --methods "nb1 lexical+question 8%,nb1 lexical+question 8% + restart after@12"
    .venv/bin/python benchmarks/restart_depth.py --split dev --count 60 --methods "nb1 deviation,nb1 deviation through@15"
    .venv/bin/python benchmarks/restart_depth.py --quick    # 1 dev fact question: "nb1 question", "+ restart others@-1", deviation at0 through@1

A recomputed row costs every layer from layer 0, because a record keeps only K and V, not the
residual stream they were computed from. If a chunk's record also kept the residual stream
entering one layer m (one vector per token: 576 numbers for SmolLM2 against 30 layers x 384 of
K/V, 5% more; 896 against 24 x 256 for Qwen, 15% more), a row could be recomputed from layer m
on: it would attend over the blended prompt (the named passage, the question) in the layers where
the stale records differ most from full prefill (their deviation grows with depth), for
(L - m) / L of a row's cost. Stop 44's ablation (docs/ADAPTIVE-BUDGET.md) found that the answers
Qwen's default loses come back when the passages after the named one are recomputed from layer 0;
this measures what recomputing them from layer m keeps, and at what cost.

Methods: ``"<base> + restart <where>@<m>"``, a select_eval method ``<base>`` (its config, selector and
records) with the reused rows of ``<where>`` also recomputed from layer ``m`` on (m < 0: L + m)
(``BlendInput.restart``, ``blending/blend.py``), starting from the residual stream that entered
layer m when their record was computed (captured here while the engine warms: a chunk's lead
record behind the chunk context alone, its other record behind its neighbour):

- ``after``: every chunk after the one the question names (``lexical.named_chunk``; none where
  it names none);
- ``others``: every chunk but the named one (every chunk where it names none).

The mirror, ``"<base> through@<D>"`` (stop 67): the selected rows of a one-pass ``<base>`` recomputed
from layer 0 through layer D - 1 only, so from D on they keep their records' K/V and only the
uncached rows and the last row are computed. It needs no stream: it is a product config, the base's
with a last check layer at D that keeps no reused row (``check_layers=(..., D)``,
``ratios=(..., 0.0)``). If staleness mattered in the early and middle layers only, these rows
would cost D / L of a row each.

The stored stream is rounded to fp16, as the records are. The cost column is in row-layers: the
rows each layer computed (a two-stage blend's first stage included) over layers x prompt tokens,
so a row restarted at m counts (L - m) / L. named_after.py's methods are known too (``"nb1 named after"``: the
same rows recomputed from the check layer). Every other argument is select_eval.py's, so the
tables, run files and the full-prefill reference are its; its ``recomputed`` column counts a
restarted row as a whole row.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import torch

import named_after
import select_eval
import cacheblend.prefilling as prefilling
import cacheblend.warming as warming
from cacheblend.blending.inputs import Restart
from cacheblend.blending.lexical import chunk_scores, named_chunk
from cacheblend.blending.question import chunk_ids
from cacheblend.blending.selectors import make_selector
from cacheblend.models.adapter import ModelAdapter
from cacheblend.prompts.assemble import aligned_rows

WHERE = ("after", "others")


class Streams:
    """The residual streams entering ``layers`` of every row warming computed, by the row's ids
    (the context, then the chunk): what each record's K/V at those layers were computed from."""

    def __init__(self) -> None:
        self.layers: set[int] = set()
        self.rows: dict[tuple[int, ...], dict[int, torch.Tensor]] = {}
        self._capture: dict[int, torch.Tensor] | None = None
        self._context: int | None = None  # the rows' common prefix (the chunk context), once per warm

    def install(self) -> None:
        """Wraps warming's forward (which rows) and the adapter's qkv (what enters each layer)."""
        real_forward, real_qkv = warming.forward_padded, ModelAdapter.qkv

        def qkv(adapter, layer, h):
            if self._capture is not None and (layer in self.layers or layer - adapter.num_layers in self.layers):
                self._capture[layer] = h.to(torch.float16)  # [B, T, hidden], as a store would keep it
            return real_qkv(adapter, layer, h)

        def forward_padded(adapter, context_ids, chunks):
            self._capture = {}
            try:
                out = real_forward(adapter, context_ids, chunks)
                for b, tok in enumerate(chunks):
                    row = (*context_ids, *tok)
                    self.rows[row] = {m: h[b, : len(row)] for m, h in self._capture.items()}  # m >= 0
                self._context = None
            finally:
                self._capture = None
            return out

        ModelAdapter.qkv, warming.forward_padded = qkv, forward_padded

    def of(self, chunk: tuple[int, ...], lead: bool, layer: int) -> torch.Tensor:
        """[len(chunk), hidden] of ``chunk``'s record: its lead record (behind the context alone:
        a row that starts with the context and the chunk) or its record behind a neighbour (the
        row that ends with the chunk behind more than the context)."""
        if self._context is None:
            self._context = len(_common_prefix(list(self.rows)))
        context, n = self._context, len(chunk)
        for row in self.rows:
            if lead and row[context : context + n] == chunk:
                return self.rows[row][layer][context : context + n]
            if not lead and len(row) > context + n and row[-n:] == chunk:
                return self.rows[row][layer][-n:]
        raise LookupError(f"no warmed row holds this chunk ({'lead' if lead else 'behind a neighbour'})")


def _common_prefix(rows: list[tuple[int, ...]]) -> tuple[int, ...]:
    first = min(rows, key=len)
    for i, t in enumerate(first):
        if any(r[i] != t for r in rows):
            return first[:i]
    return first


STREAMS = Streams()
COSTS: dict[str, list[float]] = {}
_CURRENT: list = [None]  # the (prefiller, request) of the prefill running now


class Restarting:
    """``inner`` (a selector) with the rows of ``where`` restarted at ``layer`` (None: nothing
    restarted, only the cost recorded under ``name``)."""

    def __init__(self, name: str, inner, where: str | None = None, layer: int | None = None) -> None:
        if where is not None and where not in WHERE:
            raise ValueError(f"where: one of {WHERE}, not {where!r}")
        self.name, self.inner, self.where, self.layer = name, inner, where, layer

    def __call__(self, cand, budget: int):
        return self.inner(cand, budget)

    def __getattr__(self, attr):  # two_stage, stage_one_for, fusion, needs_query, ...: the inner selector's
        return getattr(self.inner, attr)

    def restart(self, inp) -> Restart | None:
        """The restart of this prompt: the rows of ``where`` with their warm-time streams."""
        if self.where is None or inp.cached is None:
            return None
        prefiller, request = _CURRENT[0]
        layer = self.layer % prefiller.adapter.num_layers  # -1: the last layer
        positions = inp.reused.nonzero().flatten()  # [r]
        chunk = chunk_ids(inp.reused[positions], inp.chunk_offsets[positions])  # [r]
        asking = torch.arange(inp.ids.shape[0]) > int(positions[-1])
        named = named_chunk(chunk_scores(inp.ids[positions], chunk, inp.ids[asking]), inp.first_alone)
        if named is None:
            pick = torch.full_like(chunk, self.where == "others", dtype=torch.bool)  # every chunk, or none
        else:
            pick = (chunk > named) if self.where == "after" else (chunk != named)
        if not bool(pick.any()):
            return None
        hidden = torch.zeros((inp.ids.shape[0], prefiller.adapter.config.hidden_size), dtype=torch.float16)
        spans = request.text.chunks
        for j, span in enumerate(spans):
            enc = prefiller.encode_chunk(span.text)
            rows, chunk_rows = aligned_rows(request.encoding, span, enc)
            if not rows:
                continue
            stream = STREAMS.of(tuple(enc.ids), j == 0 and inp.first_alone, layer)  # [len, hidden]
            hidden[rows] = stream[chunk_rows]
        chosen = positions[pick]
        _check(prefiller.adapter, layer, hidden[chosen], inp.cached[layer, 1][:, chosen])
        return Restart(layer, chosen, hidden[chosen])


def _check(adapter, layer: int, hidden: torch.Tensor, stored_v: torch.Tensor) -> None:
    """The streams are the records' own: projected through ``layer``'s norm and V, they give the
    V the records hold there (stored_v [Hkv, r, d]; fp16 on both sides, so a loose tolerance)."""
    with torch.inference_mode():
        _, v = adapter.kv(layer, adapter.attn_input(layer, hidden[None].to(adapter.dtype)))
    err = (v[0].float() - stored_v.float()).abs().max().item()
    scale = stored_v.float().abs().max().item()
    if err > 0.02 * scale + 1e-3:
        raise AssertionError(f"the kept stream does not give the record's V at layer {layer}: max error {err:.4f} of {scale:.3f}")


def _blend_prefill(real):
    def blend_prefill(model, inp, selector, schedule, *args, **kwargs):
        restart = selector.restart(inp) if isinstance(selector, Restarting) else None
        out = real(model, replace(inp, restart=restart) if restart is not None else inp, selector, schedule, *args, **kwargs)
        if isinstance(selector, Restarting):
            rows = sum(out.active_per_layer) + sum(a.shape[0] for a in out.first_stage_active)
            COSTS.setdefault(selector.name, []).append(rows / (model.num_layers * inp.ids.shape[0]))
        return out

    return blend_prefill


def through(config, depth: int):
    """``config`` (one pass, a fixed ratio) with its selected rows recomputed through layer ``depth`` - 1
    only: a last check layer at ``depth`` keeping no reused row."""
    selector = make_selector(config)
    if config.auto_budget or getattr(selector, "two_stage", False) or hasattr(selector, "stage_one_for"):
        raise SystemExit(f"through@{depth} takes a one-pass method at a fixed ratio, not selector {config.selector!r}")
    if depth <= max(config.check_layers):
        raise SystemExit(f"through@{depth} must come after the check layers {config.check_layers}")
    return replace(config, check_layers=config.check_layers + (depth,), ratios=config.ratios + (0.0,))


def register(names: list[str]) -> None:
    """Adds the ``"<base> + restart <where>@<m>"`` and ``"<base> through@<D>"`` methods of ``names`` to
    select_eval's, wraps every other method's selector to count its row-layers, and installs the hooks."""
    for name in names:
        base, _, depth = name.partition(" through@")
        if not depth:
            base, _, spec = name.partition(" + restart ")
        if base not in select_eval.METHODS:
            raise SystemExit(f"unknown base method {base!r}")
        if depth:
            config = through(select_eval.METHODS[base][0], int(depth))
            select_eval.METHODS[name] = (config, Restarting(name, make_selector(config)))
            continue
        config, sel = select_eval.METHODS[base]
        inner = sel if sel is not None else make_selector(config)
        where, layer = (spec.split("@") + [None])[:2] if spec else (None, None)
        if spec:
            STREAMS.layers.add(int(layer))
        select_eval.METHODS[name] = (config, Restarting(name, inner, where, None if layer is None else int(layer)))
    STREAMS.install()
    prefilling.blend_prefill = _blend_prefill(prefilling.blend_prefill)
    real_run, real_table = prefilling.Prefiller.run, select_eval.table

    def run(self, request, *args, **kwargs):
        _CURRENT[0] = (self, request)
        return real_run(self, request, *args, **kwargs)

    def table(summary, count):
        for name, shares in COSTS.items():
            if name in summary:
                summary[name]["row_layers"] = sum(shares) / len(shares)
        lines = [f"| {n} | {s['row_layers']:.1%} |" for n, s in summary.items() if "row_layers" in s]
        return real_table(summary, count) + "\n\n| method | recomputed, row-layers |\n|---|---|\n" + "\n".join(lines)

    prefilling.Prefiller.run, select_eval.table = run, table


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    quick = "nb1 question,nb1 question + restart others@-1,nb1 deviation at0,nb1 deviation at0 through@1"  # any model
    methods = quick if "--quick" in argv else argv[argv.index("--methods") + 1] if "--methods" in argv else ""
    named_after.register()  # "nb1 named after": the chunks after the named one recomputed from the check layer
    # deviation checked at layer 0 (its layer-0 K/V computed for every row there, no layer-0 prelude):
    # a one-pass base whose through@1 exists on any model, the quick run's 2-layer one too
    select_eval.METHODS["nb1 deviation at0"] = (replace(select_eval.METHODS["nb1 deviation"][0], check_layers=(0,)), None)
    register(methods.split(",") if methods else [])
    select_eval.main_with(__doc__, quick, argv)


if __name__ == "__main__":
    main()
