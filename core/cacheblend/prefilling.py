"""The request path: a validated ``Request``, its chunks' records, the blend, a ``Prefilled``.

A ``Prefiller`` is built once per engine from what it needs: the model adapter, a tokenizer
function for chunk spans, a ``records`` function (chunk ids in prompt order -> the records their
places read, None for a miss; with ``lead_after_named`` it is also given ``lead_from`` and
``lead_weight``, as ``ChunkKV.records`` takes them) and the engine's config and selector. ``run``
takes one request:

1. the chunk spans' own encodings (``prompts.assemble.chunk_encodings``), skipped for a full prefill;
2. their records, in one call (one round trip per tier; which record each chunk reads: ``_records``);
3. ``assemble`` (pure: ids + cached rows), the prompt's head from the ``HeadCache`` (the exact
   K/V of the rows before the first chunk, computed once per head: ``blending/head.py``), then
   ``blend_prefill`` (the algorithm, in ``blending/blend.py``);
4. the statistics, and the texts of the chunks that missed (``Prefilled.missed``: what warm on
   miss warms later); with the doubt gate (``BlendConfig.doubt_margin``), how to prefill the
   request again at its ratio (``Prefilled.doubt``: decoding calls it when in doubt).

A per-call ``config`` may change the blend knobs, never what keys the KV (a ValueError, not a
silent ignore), and cannot switch away from a custom selector.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from .blending.blend import blend_prefill
from .blending.gap import record_gap
from .blending.head import HeadCache
from .blending.lexical import named_before_blend
from .blending.selection import Selector
from .blending.selectors import make_selector
from .config import BlendConfig
from .generation.decode import Prefilled
from .generation.doubt import Doubt
from .models.adapter import ModelAdapter
from .prompts.assemble import assemble, chunk_encodings
from .prompts.prepared import Request
from .prompts.tokenize import Encoding
from .stores import ChunkRecord

Records = Callable[[list[list[int]]], Sequence[ChunkRecord | None]]


def named_in(request: Request, chunks: list[list[int]], encode_chunk: Callable[[str], Encoding],
             margin: float = 0.0) -> int | None:
    """``lexical.named_before_blend`` of ``request``: its ``chunks`` (their own ids, prompt order)
    and its text after the last chunk, tokenized as chunks are, before any record is read."""
    tail = request.text.text[request.text.chunks[-1].end:]
    return named_before_blend(chunks, list(encode_chunk(tail).ids) if tail else [], margin)


class Prefiller:
    """Blended prefills of validated requests for one model; see the module docstring."""

    def __init__(
        self,
        adapter: ModelAdapter,
        encode_chunk: Callable[[str], Encoding],
        records: Records,
        config: BlendConfig,
        selector: Selector | None = None,
        heads: HeadCache | None = None,
    ) -> None:
        config.check_model_layers(adapter.num_layers)
        self.adapter, self.encode_chunk, self.records = adapter, encode_chunk, records
        self.config, self.selector = config, selector
        self.heads = heads if heads is not None else HeadCache()

    def run(
        self, request: Request, ratio: float | None = None, config: BlendConfig | None = None, started: float | None = None
    ) -> Prefilled:
        """The blended prefill of ``request``; ``ratio`` overrides the config's recompute ratio
        (1.0: a full prefill, nothing read); ``started``: when the request arrived (for TTFT)."""
        started = time.perf_counter() if started is None else started
        cfg = self.call_config(config)
        cfg = cfg.with_ratio(ratio) if ratio is not None else cfg
        full = cfg.recompute_ratio >= 1.0 or cfg.selector == "all"
        chunks = [] if full else chunk_encodings(request.text, self.encode_chunk)
        t = time.perf_counter()
        records = list(self._records(request, [c.ids for c in chunks], cfg)) if chunks else []
        lookup_s = time.perf_counter() - t
        # the first chunk reads a record warmed behind the chunk context alone: its lead record, or any
        # record of an engine warming alone (a lead record lost from every tier while its plain one
        # stayed would be read in its place and still count: the selector then skips a chunk it could help)
        first_alone = cfg.neighbours == 0 or cfg.lead_alone
        asm = assemble(request.text, request.encoding, chunks, records, self.adapter.device, first_alone)
        selector = self.selector if self.selector is not None else make_selector(cfg)
        two = cfg.neighbours > 0 and cfg.lead_alone  # each chunk stored twice; else the draft scores alone
        if getattr(selector, "needs_gap", False) and asm.places and two:  # both records of every chunk read
            t = time.perf_counter()
            leads = self.records([c.ids for c in chunks], lead_from=0)  # each chunk's lead record
            asm.input.gap = record_gap(asm.places, records, leads, len(asm.input.ids))
            lookup_s += time.perf_counter() - t
        asm.load_s += lookup_s  # reading the records, then gathering them (assemble's part)
        t = time.perf_counter()
        limit = 0 if full else request.head_tokens
        asm.input, read = self.heads.with_head(self.adapter, asm.input, limit)  # computed the first time
        out = blend_prefill(self.adapter, asm.input, selector, cfg.schedule(), cfg.fresh_check, spread=cfg.spread)
        chosen = out.ratio if out.ratio is not None else cfg.recompute_ratio  # an auto budget reports its pick
        stats = asm.stats(out.recomputed + (0 if read else asm.input.head), 1.0 if full else chosen)
        stats.budget_signal = out.budget_signal
        stats.first_stage_tokens, stats.first_stage_s = out.first_stage_rows, out.first_stage_s
        stats.draft_margin = out.draft_margin
        stats.head_tokens = asm.input.head if read else 0  # a head computed for this request counts as computed
        stats.prefill_s = time.perf_counter() - t
        stats.ttft_s = time.perf_counter() - started
        missed = [span.text for span, rec in zip(request.text.chunks, records) if rec is None]
        doubt = None
        if cfg.doubt_margin > 0 and (1.0 if full else chosen) < cfg.doubt_ratio:  # the gate's redo has none
            again = replace(cfg, doubt_margin=0.0)
            doubt = Doubt(cfg.doubt_margin, lambda: self.run(request, cfg.doubt_ratio, again))
        return Prefilled(self.adapter, asm.input.ids, out, stats, missed, doubt)

    def _records(self, request: Request, chunks: list[list[int]], cfg: BlendConfig):
        """Step 2. With ``lead_after_named`` the chunks after the one the question names (its text
        after the last chunk, tokenized as chunks are; by ``lead_after_margin`` over the next chunk)
        read their lead records, or with a weight below 1 their neighbour-warmed records moved that far toward them."""
        if not cfg.lead_after_named:
            return self.records(chunks)
        named = named_in(request, chunks, self.encode_chunk, cfg.lead_after_margin)
        if named is None:
            return self.records(chunks)
        return self.records(chunks, lead_from=named + 1, lead_weight=cfg.lead_after_named)

    def call_config(self, config: BlendConfig | None) -> BlendConfig:
        """The config of one call: ``config`` may change the blend knobs, never what keys the KV,
        and not the selector of a prefiller built with a custom one."""
        if config is None:
            return self.config
        diff = config.kv_differences(self.config)
        if diff:
            said = ", ".join(f"{f}={a!r} (the engine's: {b!r})" for f, (a, b) in diff.items())
            raise ValueError(f"config= changes what keys the KV: {said}; that is fixed per engine (build one with "
                             "it), or pass config.with_kv_of(engine.config) to change only the blend")
        if self.selector is not None and config.selector != self.config.selector:
            raise ValueError(f"this engine blends with a custom selector ({type(self.selector).__name__}); "
                             f"config= cannot switch it to {config.selector!r}")
        config.check_model_layers(self.adapter.num_layers)
        return config
