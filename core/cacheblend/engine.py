"""BlendEngine: the facade. Warm chunks, then prefill and generate with their KV blended in.

    engine = BlendEngine.from_pretrained("smollm2-135m-instruct")
    engine.warm(passages, store_dir="index/cacheblend")
    out = engine.generate(chunks=passages[:3], query="Who ...?")
    out = engine.generate(prompt=any_prompt_that_contains_warmed_passages)

The algorithm's order lives in ``blending/blend.py`` and the warming pipeline in ``warming.py``;
this module wires tokenization, stores, selection and decoding around them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from .blending.blend import blend_prefill
from .blending.selection import Selector, make_selector
from .config import BlendConfig
from .generation.decode import Decoding, GenerationStream, Prefilled, eos_ids
from .models import bundled
from .models.adapter import adapt
from .models.loading import load_pretrained
from .neighbours import NeighbourIndex
from .prompts.assemble import assemble, chunk_encodings
from .prompts.finder import ChunkFinder
from .prompts.prepared import Request, RequestBuilder
from .prompts.request import clean_chunk, has_chat_template, render_chat
from .prompts.tokenize import Encoding, chunk_context_ids, encode_chunk, encode_prompt
from .result import Generation
from .stores import ChunkKey, ChunkRecord, KVTier, MemoryStore, RecordKeys, StoreChain, compact, model_fingerprint, open_tier
from .warming import Warmer, WarmSetup


class BlendEngine:
    """One model, its chunk KV stores, and blended generation over them."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        config: BlendConfig | None = None,
        selector: Selector | None = None,
        memory_bytes: int = 2 << 30,
        name: str | None = None,
    ) -> None:
        self.config = config or BlendConfig()
        self.adapter = adapt(model)
        self.tokenizer = tokenizer
        self.name = name or str(getattr(model.config, "_name_or_path", "") or model.config.model_type)
        self.config.check_model_layers(self.adapter.num_layers)
        self.selector = selector
        self.context_ids = chunk_context_ids(tokenizer, self.config.chunk_context)  # each chunk is warmed behind
        self.neighbours = self.config.neighbours  # ... and behind this many similar passages (fixed: it keys the KV)
        # with neighbours, also kept alone (the "lead" variant) for the prompt's first chunk (fixed: what warm() stores)
        self.lead_alone = bool(self.neighbours and self.config.lead_alone)
        self.fingerprint = model_fingerprint(
            model, tokenizer, kv_dtype=self.config.kv_dtype, context_ids=self.context_ids,
            neighbours=self.neighbours,
        )
        self.record_keys = RecordKeys(self.fingerprint, self.lead_alone)  # ids -> (as warmed, lead or None)
        self.stores = StoreChain(MemoryStore(memory_bytes))
        self.finder = ChunkFinder()
        self.neighbour_index = NeighbourIndex()  # filled by warm() when neighbours > 0
        setup = WarmSetup(tuple(self.context_ids), self.neighbours, self.config.kv_dtype, self.context_window)
        self.warmer = Warmer(self.adapter, lambda text: self.encode_chunk(text).ids, self.record_keys,
                             self.neighbour_index, setup)
        self.tokens_warmed = 0  # tokens computed by warm() so far, contexts and neighbours included
        self.eos_ids = eos_ids(model, tokenizer)
        self._lock = threading.RLock()
        self.requests = RequestBuilder(tokenizer, self.finder, self.context_window, self._lock)

    @classmethod
    def from_pretrained(
        cls,
        model: str = bundled.ALIAS,
        *,
        device: str = "auto",
        dtype: str | torch.dtype | None = None,
        config: BlendConfig | None = None,
        store_dir: str | Path | None = None,
        memory_bytes: int = 2 << 30,
    ) -> BlendEngine:
        """Loads a HF model id or folder, a ``.gguf`` file, or the bundled alias ``smollm2-135m-instruct``.

        device: ``cpu``, ``cuda`` (``cuda:N``) or ``auto``; dtype: None picks fp32 on CPU and
        bf16 on CUDA. ``store_dir`` attaches a KV store: a folder (a disk store, created on first
        write) or a Redis URL (a store shared by every process attached to it; see ``attach_store``).
        """
        hf_model, tok = load_pretrained(str(model), device=device, dtype=dtype)
        engine = cls(hf_model, tok, config=config, memory_bytes=memory_bytes, name=str(model))
        if store_dir is not None:
            engine.attach_store(store_dir)
        return engine

    # -- properties ---------------------------------------------------------------------------
    @property
    def context_window(self) -> int:
        return self.adapter.max_positions

    @property
    def max_chunk_tokens(self) -> int:
        """The longest chunk ``warm`` accepts: the context window minus the chunk context."""
        return self.warmer.max_chunk_tokens

    @property
    def is_chat_model(self) -> bool:
        return has_chat_template(self.tokenizer)

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` as a whole prompt (special tokens the tokenizer adds included)."""
        return len(encode_prompt(self.tokenizer, text).ids)

    def encode_chunk(self, text: str) -> Encoding:
        """A chunk's tokens as they are warmed and looked up (as after a line break)."""
        return encode_chunk(self.tokenizer, text)

    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        """The model's chat template over role/content messages, ending with the assistant turn."""
        return render_chat(self.tokenizer, messages)

    # -- stores and warming ---------------------------------------------------------------------
    def attach_store(self, store_dir: str | Path) -> KVTier:
        """Reads chunk KV from (and learns the chunk texts of) the store at ``store_dir``: a folder
        (a disk store) or a Redis URL (``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``;
        ``?ttl=&timeout=&retry_after=`` in seconds, see ``RedisStore.from_url``), which every process
        attached to it shares and ``warm`` writes through to (``cacheblend.stores.tier``)."""
        tier = open_tier(store_dir, self.fingerprint, compact.codec_for(self.config.kv_dtype))
        with self._lock:
            tier = self.stores.attach(tier)
            self.finder.add(tier.texts())
            return tier

    def chunk_keys(self, texts: Iterable[str]) -> list[ChunkKey]:
        """The store keys of ``texts`` (no compute): e.g. to see which a store already holds."""
        return [self.record_keys(self.encode_chunk(clean_chunk(t)).ids)[0] for t in texts]

    def is_warm(self, text: str) -> bool:
        """Whether the KV of ``text`` (both its records, with ``lead_alone``) is in memory or an
        attached store (no compute)."""
        keys = [k for k in self.record_keys(self.encode_chunk(clean_chunk(text)).ids) if k is not None]
        with self._lock:
            return all(key in self.stores for key in keys)

    def warm(
        self,
        texts: Iterable[str],
        *,
        store_dir: str | Path | None = None,
        batch_size: int = 8,
        progress: bool | None = None,
        neighbours: Sequence[Sequence[str]] | None = None,
    ) -> list[ChunkKey]:
        """Computes and stores the KV of every text not stored yet; returns their keys in order.

        Idempotent: a chunk found in memory or any attached store costs nothing (it is copied into
        ``store_dir`` if that store lacks it). Every text is validated before any compute. Attached
        Redis stores are written through: a chunk one of them lacks is written to it.
        ``progress``: a progress bar (default: when 16 or more chunks need computing).
        ``neighbours`` (with ``BlendConfig.neighbours`` > 0): for each text, the passages to compute
        it behind, most similar first (e.g. a vector index's nearest neighbours); by default the
        engine picks the most similar chunks it knows (``cacheblend.neighbours``).
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        chunks = self.warmer.prepare(texts)
        given = self.warmer.given_neighbours(chunks, neighbours)
        with self._lock:
            target = self.attach_store(store_dir) if store_dir is not None else None
            if self.neighbours:
                self.warmer.learn(chunks, self.finder)
            report = self.warmer.run(chunks, self.stores, target, given=given, batch_size=batch_size, progress=progress)
            self.tokens_warmed += report.tokens
            self.finder.add(c.text for c in chunks)
        return report.keys

    # -- prefill and generation -----------------------------------------------------------------
    def request(
        self,
        prompt: str | Request | None = None,
        *,
        chunks: Sequence[str] | None = None,
        query: str | None = None,
        prefix: str | None = None,
    ) -> Request:
        """The request validated, as one prompt string with the spans of its chunks (a raw prompt
        searched for warmed chunks, or explicit chunks wrapped by the chat template around
        ``prefix``/``query``), tokenized and checked against the context window, once: prefill,
        stream and generate take it as it is. A ``Request`` is returned unchanged.
        ContextLengthError (a ValueError) when it does not fit."""
        return self.requests.build(prompt, chunks, query, prefix)

    def prefill(
        self,
        prompt: str | Request | None = None,
        *,
        chunks: Sequence[str] | None = None,
        query: str | None = None,
        prefix: str | None = None,
        recompute_ratio: float | None = None,
        config: BlendConfig | None = None,
    ) -> Prefilled:
        """Blended prefill of a request. ``recompute_ratio`` 1.0 is a full prefill (no cache read).
        ``config``: other blend knobs for this call (see ``BlendConfig``; what keys the KV stays
        the engine's: a config that changes it is a ValueError)."""
        started = time.perf_counter()
        return self._prefill(self.request(prompt, chunks=chunks, query=query, prefix=prefix), recompute_ratio, config, started)

    def _prefill(self, request: Request, ratio, config, started) -> Prefilled:
        cfg = self._call_config(config)
        cfg = cfg.with_ratio(ratio) if ratio is not None else cfg
        full = cfg.recompute_ratio >= 1.0 or cfg.selector == "all"
        chunks = [] if full else chunk_encodings(request.text, self.encode_chunk)
        t = time.perf_counter()
        with self._lock:
            records = self._lookup([c.ids for c in chunks]) if chunks else []  # one call: one round trip per tier
        lookup_s = time.perf_counter() - t
        asm = assemble(request.text, request.encoding, chunks, records, self.adapter.device)
        asm.load_s += lookup_s  # reading the records, then gathering them (assemble's part)
        selector = self.selector if self.selector is not None else make_selector(cfg)
        t = time.perf_counter()
        out = blend_prefill(self.adapter, asm.input, selector, cfg.schedule(), cfg.fresh_check)
        stats = asm.stats(out.recomputed, cfg.recompute_ratio if not full else 1.0)
        stats.first_stage_tokens = out.first_stage_rows
        stats.prefill_s = time.perf_counter() - t
        stats.ttft_s = time.perf_counter() - started
        return Prefilled(self.adapter, asm.input.ids, out, stats)

    def _call_config(self, config: BlendConfig | None) -> BlendConfig:
        """The config of one call: ``config`` may change the blend knobs, never what keys the KV,
        and not the selector of an engine built with a custom one."""
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

    def _lookup(self, chunks: list[list[int]]) -> list[ChunkRecord | None]:
        return self.stores.prompt_records(chunks, self.record_keys)

    def token_ids(self, prompt: str | Request) -> list[int]:
        """The token ids the engine feeds for a raw prompt (no compute, no cache read, no length
        check: for counting) or a ``Request`` (``engine.request(chunks=..., query=...).ids``)."""
        return prompt.ids if isinstance(prompt, Request) else encode_prompt(self.tokenizer, prompt).ids

    def stream(
        self,
        prompt: str | Request | None = None,
        *,
        chunks: Sequence[str] | None = None,
        query: str | None = None,
        prefix: str | None = None,
        recompute_ratio: float | None = None,
        **options: Any,
    ) -> GenerationStream:
        """Like ``generate`` but yields text as it is produced; ``.result`` holds the Generation.

        ``options``: ``max_new_tokens`` (256), ``temperature`` (0: greedy), ``top_p``, ``top_k``,
        ``seed`` and ``stop`` (``generation.decode.Decoding.of``; an unknown name is a ValueError).
        Everything is validated here; the prefill starts with the first ``next()``.
        """
        request = self.request(prompt, chunks=chunks, query=query, prefix=prefix)
        decoding = Decoding.of(**options)
        return self._stream(lambda t0: self._prefill(request, recompute_ratio, None, t0), decoding)

    def _stream(self, prefill, decoding: Decoding) -> GenerationStream:
        return GenerationStream(prefill, decoding, self.tokenizer, self.eos_ids, self.context_window)

    def generate(self, prompt: str | Request | None = None, **kwargs: Any) -> Generation:
        """Generates an answer. Takes ``prompt`` (a string or a ``Request``) or
        ``chunks``/``query``/``prefix``, plus ``recompute_ratio`` and the decoding options of
        ``stream``. Returns the text (never the prompt) and BlendStats."""
        return self.stream(prompt, **kwargs).consume()

    def generate_from(self, prefilled: Prefilled, *, max_new_tokens: int = 256, **sampling: Any) -> Generation:
        """Decodes from an existing prefill (its KV is copied, so it can be decoded again).
        Takes the sampling options and ``stop`` of ``generate``; timings count from this call."""
        return self._stream(lambda t0: prefilled, Decoding.of(max_new_tokens=max_new_tokens, **sampling)).consume()
