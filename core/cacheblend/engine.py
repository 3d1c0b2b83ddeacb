"""BlendEngine: the facade. Warm chunks, then prefill and generate with their KV blended in.

    engine = BlendEngine.from_pretrained("smollm2-135m-instruct")
    engine.warm(passages, store_dir="index/cacheblend")
    out = engine.generate(chunks=passages[:3], query="Who ...?")
    out = engine.generate(prompt=any_prompt_that_contains_warmed_passages)

It wires two components and holds no algorithm: ``chunk_kv.ChunkKV`` (what keys chunk KV, the
tiers, the texts looked for in prompts, warming, warm on miss) and ``prefilling.Prefiller`` (the
request path; the blend's order lives in ``blending/blend.py``); decoding is ``generation.lockstep``
(one batched forward per step for every answer).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from .blending.head import DEFAULT_BYTES, HeadCache
from .blending.selection import Selector
from .chunk_kv import ChunkKV
from .config import BlendConfig
from .generation.decode import Decoding, Prefilled, eos_ids
from .generation.shared import SharedDecode
from .generation.stream import GenerationStream
from .generation.turns import interleave
from .models import bundled
from .models.adapter import adapt
from .models.loading import load_pretrained
from .prefilling import Prefiller
from .prompts.prepared import Request, RequestBuilder
from .prompts.request import has_chat_template, render_chat
from .prompts.tokenize import encode_prompt
from .result import Generation
from .stores import ChunkKey, KVTier


class BlendEngine:
    """One model, its chunk KV (``self.kv``), and blended generation over it.

    ``warm_on_miss``: a chunk a prefill finds in no tier is warmed afterwards on a background
    thread while no generation runs (``cacheblend.warm_on_miss``), so the next prompt holding it hits.
    ``head_bytes``: what the head cache keeps of prompt heads' exact K/V (the tokens before the
    first chunk, computed once per head: ``blending/head.py``); 0 turns it off.
    ``decode_batch``: how many answers whose decoding overlaps (``stream``/``generate`` from several
    threads, or read in turn) share each decode step (``generation/shared.py``); 1 decodes one at a time."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        config: BlendConfig | None = None,
        selector: Selector | None = None,
        memory_bytes: int = 2 << 30,
        name: str | None = None,
        warm_on_miss: bool = False,
        head_bytes: int = DEFAULT_BYTES,
        decode_batch: int = 16,
    ) -> None:
        config = config or BlendConfig()
        self.adapter, self.tokenizer = adapt(model), tokenizer
        self.name = name or str(getattr(model.config, "_name_or_path", "") or model.config.model_type)
        self.kv = kv = ChunkKV(self.adapter, tokenizer, config, memory_bytes)  # fingerprint, tiers, finder, warmer
        self.prefiller = Prefiller(self.adapter, kv.encode, kv.records, config, selector, HeadCache(head_bytes))
        self.eos_ids = eos_ids(model, tokenizer)
        self.decoder = SharedDecode(self.adapter, self.eos_ids, decode_batch)  # overlapping answers share steps
        self.requests = RequestBuilder(tokenizer, kv.finder, self.context_window, kv.lock)
        if warm_on_miss:
            kv.enable_warm_on_miss()

    @classmethod
    def from_pretrained(
        cls,
        model: str = bundled.ALIAS,
        *,
        device: str = "auto",
        dtype: str | torch.dtype | None = None,
        store_dir: str | Path | None = None,
        **options: Any,
    ) -> BlendEngine:
        """Loads a HF model id or folder, a ``.gguf`` file, or the bundled alias ``smollm2-135m-instruct``.

        device: ``cpu``, ``cuda`` (``cuda:N``) or ``auto``; dtype: None picks fp32 on CPU and bf16
        on CUDA. ``store_dir``: a KV store to attach (``attach_store``). ``options``: the
        constructor's (``config``, ``memory_bytes``, ``warm_on_miss``, ...); without ``config``, a
        catalogue alias starts from its own choice (``BlendConfig.for_model``)."""
        hf_model, tok = load_pretrained(str(model), device=device, dtype=dtype)
        if options.get("config") is None:
            options["config"] = BlendConfig.for_model(str(model))
        engine = cls(hf_model, tok, name=str(model), **options)
        if store_dir is not None:
            engine.attach_store(store_dir)
        return engine

    @property
    def config(self) -> BlendConfig:
        return self.prefiller.config

    @property
    def context_window(self) -> int:
        return self.adapter.max_positions

    @property
    def is_chat_model(self) -> bool:
        return has_chat_template(self.tokenizer)

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` as a whole prompt (special tokens the tokenizer adds included)."""
        return len(encode_prompt(self.tokenizer, text).ids)

    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        """The model's chat template over role/content messages, ending with the assistant turn."""
        return render_chat(self.tokenizer, messages)

    # -- chunk KV (``ChunkKV``) ---------------------------------------------------------------------
    def attach_store(self, store_dir: str | Path, *, max_bytes: int | None = None) -> KVTier:
        """Reads chunk KV from (and learns the chunk texts of) the store at ``store_dir``: a folder
        (a disk store) or a URL of a tier in ``cacheblend.stores.tier.SCHEMES`` (``redis://`` ...,
        shared by every process attached to it; ``warm`` writes through to it). ``max_bytes``: a
        folder's byte budget (``stores/policy.py`` evicts; a Redis server bounds itself)."""
        return self.kv.attach(store_dir, max_bytes)

    def warm(
        self,
        texts: Iterable[str],
        *,
        store_dir: str | Path | None = None,
        batch_size: int = 8,
        progress: bool | None = None,
        behind: Sequence[Sequence[str]] | None = None,
    ) -> list[ChunkKey]:
        """Computes and stores the KV of every text not stored yet; returns their keys in order.

        Idempotent: a chunk found in memory or any attached store costs nothing (it is copied into
        ``store_dir`` if that store lacks it); shared tiers are written through. Every text is
        validated before any compute. ``progress``: a progress bar (default: 16 chunks or more).
        ``behind`` (with ``BlendConfig.neighbours`` > 0): for each text, the passages to compute
        it behind, most similar first; by default the most similar chunks the engine knows."""
        target = self.attach_store(store_dir) if store_dir is not None else None
        return self.kv.warm(texts, target, behind, batch_size, progress)

    def warm_pending(self, timeout: float = 300.0) -> bool:
        """Waits until every chunk queued by warm on miss so far is warmed (e.g. before a short-lived
        process exits); True when done within ``timeout`` s (also when warm on miss is off)."""
        return self.kv.warm_pending(timeout)

    def close(self) -> None:
        """Stops the warm-on-miss thread (queued chunks are not warmed); the engine stays usable."""
        self.kv.close()

    # -- prefill and generation -----------------------------------------------------------------
    def request(self, prompt: str | Request | None = None, *, chunks: Sequence[str] | None = None,
                query: str | None = None, prefix: str | None = None) -> Request:
        """The request validated once (``prompts.prepared``): a raw prompt searched for known chunks,
        or explicit chunks in the chat template around ``prefix``/``query``; tokenized and checked
        against the context window (ContextLengthError, a ValueError). A ``Request`` is returned as is."""
        return self.requests.build(prompt, chunks, query, prefix)

    def prefill(self, prompt: str | Request | None = None, *, recompute_ratio: float | None = None,
                config: BlendConfig | None = None, **request: Any) -> Prefilled:
        """Blended prefill of a request (``prompt`` or the ``chunks``/``query``/``prefix`` of
        ``request``). ``recompute_ratio`` 1.0 is a full prefill (no cache read). ``config``: other
        blend knobs for this call (what keys the KV stays the engine's: changing it is a ValueError)."""
        return self._prefill(self.request(prompt, **request), recompute_ratio, config, None)

    def _prefill(self, request: Request, ratio: float | None, config: BlendConfig | None, started) -> Prefilled:
        with self.kv.clock.busy():
            out = self.prefiller.run(request, ratio, config, started)
        self.kv.missed(out.missed)
        return out

    def token_ids(self, prompt: str | Request) -> list[int]:
        """The token ids the engine feeds for a raw prompt (no compute, no cache read, no length
        check: for counting) or a ``Request`` (``engine.request(chunks=..., query=...).ids``)."""
        return prompt.ids if isinstance(prompt, Request) else encode_prompt(self.tokenizer, prompt).ids

    def stream(self, prompt: str | Request | None = None, *, recompute_ratio: float | None = None,
               chunks: Sequence[str] | None = None, query: str | None = None, prefix: str | None = None,
               **options: Any) -> GenerationStream:
        """Like ``generate`` but yields text as it is produced; ``.result`` holds the Generation.
        ``options``: ``max_new_tokens`` (256), ``temperature`` (0: greedy), ``top_p``, ``top_k``,
        ``seed``, ``stop`` (``Decoding.of``: an unknown name is a ValueError). All is validated
        here; the prefill starts with the first ``next()``."""
        request, decoding = self.request(prompt, chunks=chunks, query=query, prefix=prefix), Decoding.of(**options)
        return self._stream(lambda t0: self._prefill(request, recompute_ratio, None, t0), decoding)

    def _stream(self, prefill, decoding: Decoding, decoder: SharedDecode | None = None) -> GenerationStream:
        return GenerationStream(prefill, decoding, self.tokenizer, self.context_window, decoder or self.decoder,
                                self.kv.clock.busy)

    def generate(self, prompt: str | Request | None = None, **kwargs: Any) -> Generation:
        """Generates an answer from ``prompt`` (a string or a ``Request``) or ``chunks``/``query``/
        ``prefix``, with ``recompute_ratio`` and ``stream``'s decoding options: the text (never the
        prompt) and BlendStats."""
        return self.stream(prompt, **kwargs).consume()

    def generate_from(self, prefilled: Prefilled, *, max_new_tokens: int = 256, **sampling: Any) -> Generation:
        """Decodes from an existing prefill (its KV is copied, so it can be decoded again), with
        ``generate``'s sampling options and ``stop``; timings count from this call."""
        return self._stream(lambda t0: prefilled, Decoding.of(max_new_tokens=max_new_tokens, **sampling)).consume()

    def generate_many(self, prefilled: Sequence[Prefilled], *, max_new_tokens: int = 256, max_batch: int = 16,
                      **sampling: Any) -> list[Generation]:
        """``generate_from`` for several prefills of this engine, decoded together: each step is one
        forward for up to ``max_batch`` unfinished answers (the next joins as one finishes), so the
        answers share each step's read of the weights. Answers in ``prefilled``'s order, each with
        ``generate_from``'s options; greedy answers are ``generate_from``'s up to fp32 round-off
        (a batched product sums in another order). Times count from each answer's first pick."""
        decoding = Decoding.of(max_new_tokens=max_new_tokens, **sampling)
        if any(p.adapter is not self.adapter for p in prefilled):
            raise ValueError("every prefill must come from the same engine (this one)")
        decoder = SharedDecode(self.adapter, self.eos_ids, max_batch)  # its own batch of max_batch seats
        streams = [self._stream(lambda t0, p=p: p, decoding, decoder) for p in prefilled]
        for _ in interleave(streams):
            pass
        return [s.result for s in streams]
