"""ChunkKV: everything one engine knows about chunks, apart from blending them.

What keys a chunk's KV (the chunk context it is warmed behind, how many similar passages follow
it, whether it also keeps a lead record: ``RecordKeys`` over the model fingerprint), the tiers
that hold it (``StoreChain``: memory, then attached folders, then shared servers), the texts
looked for in prompts (``ChunkFinder``), the neighbour index, the ``Warmer`` and warm on miss
(``warm_on_miss``). One lock guards the tiers, the finder and the neighbour index; the model is not
shared state, and a warm holds the lock only to look up, pick neighbours and store, never for its
compute, so a prefill's record lookup never waits for a warm's forward.

The engine (``engine.py``) owns one and hands its ``records`` to the ``Prefiller``.
"""

from __future__ import annotations

import functools
import threading
from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .config import BlendConfig
from .models.adapter import ModelAdapter
from .neighbours import NeighbourIndex
from .prompts.finder import ChunkFinder
from .prompts.request import clean_chunk
from .prompts.tokenize import Encoding, chunk_context_ids, encode_chunk
from .stores import ChunkKey, ChunkRecord, KVTier, MemoryStore, RecordKeys, StoreChain, compact, model_fingerprint, open_tier
from .warm_on_miss import BackgroundWarmer, IdleClock, MissQueue
from .warming import Warmer, WarmSetup

ENCODED_CHUNKS = 4096  # chunk texts whose tokens are remembered (``ChunkKV.encode``; ~12 kB each at 500 tokens)


class ChunkKV:
    """The chunk KV of one model and one ``BlendConfig``'s ``KV_FIELDS``; see the module docstring."""

    def __init__(self, adapter: ModelAdapter, tokenizer: Any, config: BlendConfig, memory_bytes: int = 2 << 30) -> None:
        self.tokenizer = tokenizer
        self.context_ids = chunk_context_ids(tokenizer, config.chunk_context)  # what each chunk is warmed behind
        self.neighbours = config.neighbours  # ... and behind this many similar passages (it keys the KV)
        self.lead_alone = bool(self.neighbours and config.lead_alone)  # also kept alone, for a prompt's first chunk
        self.kv_dtype = config.kv_dtype
        self.fingerprint = model_fingerprint(adapter.model, tokenizer, kv_dtype=config.kv_dtype,
                                             context_ids=self.context_ids, neighbours=self.neighbours)
        self.record_keys = RecordKeys(self.fingerprint, self.lead_alone)  # ids -> (as warmed, lead or None)
        self.stores = StoreChain(MemoryStore(memory_bytes))
        self.finder, self.neighbour_index = ChunkFinder(), NeighbourIndex()
        self.lock = threading.RLock()
        setup = WarmSetup(tuple(self.context_ids), self.neighbours, config.kv_dtype, adapter.max_positions)
        self.warmer = Warmer(adapter, lambda text: self.encode(text).ids, self.record_keys, self.neighbour_index, setup, self.lock)
        self.tokens_warmed = 0  # tokens computed by warm() so far, contexts and neighbours included
        self.clock, self.misses, self._background = IdleClock(), None, None
        self._encoded = functools.lru_cache(maxsize=ENCODED_CHUNKS)(self._encode)

    def encode(self, text: str) -> Encoding:
        """A chunk's tokens as they are warmed and looked up (as after a line break). The last
        ``ENCODED_CHUNKS`` texts are tokenized once: a chunk retrieved again is not tokenized again.
        Each call returns its own lists, so a caller changing them changes no other's."""
        ids, ends = self._encoded(text)
        return Encoding(ids.tolist(), list(zip(ends[::2], ends[1::2])))

    def _encode(self, text: str) -> tuple[array, array]:
        enc = encode_chunk(self.tokenizer, text)
        return array("q", enc.ids), array("q", [i for span in enc.offsets for i in span])

    def attach(self, location: str | Path, max_bytes: int | None = None) -> KVTier:
        """Attaches (once per location) the tier at ``location`` and learns its chunk texts."""
        tier = open_tier(location, self.fingerprint, compact.codec_for(self.kv_dtype), max_bytes=max_bytes)
        with self.lock:
            tier = self.stores.attach(tier)
            self.finder.add(tier.texts())
            return tier

    def keys(self, texts: Iterable[str]) -> list[ChunkKey]:
        """The store keys of ``texts`` (no compute): e.g. to see which a store already holds."""
        return [self.record_keys(self.encode(clean_chunk(t)).ids)[0] for t in texts]

    def is_warm(self, text: str) -> bool:
        """Whether every record of ``text`` (its lead one too) is in memory or an attached store."""
        keys = [k for k in self.record_keys(self.encode(clean_chunk(text)).ids) if k is not None]
        with self.lock:
            return all(key in self.stores for key in keys)

    def expect(self, texts: Iterable[str]) -> None:
        """Looks for ``texts`` in prompts from now on without computing their KV (each is a miss,
        computed in its prompt, until warmed: with warm on miss, right after its first miss)."""
        with self.lock:
            self.finder.add(clean_chunk(t) for t in texts)

    def warm(
        self, texts: Iterable[str], target: KVTier | None = None, behind: Sequence[Sequence[str]] | None = None,
        batch_size: int = 8, progress: bool | None = None,
    ) -> list[ChunkKey]:
        """``Warmer.run`` over the validated ``texts`` into memory, ``target`` and every shared tier."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        chunks = self.warmer.prepare(texts)
        given = self.warmer.given_behind(chunks, behind)
        if self.neighbours:
            with self.lock:
                self.warmer.learn(chunks, self.finder)
        report = self.warmer.run(chunks, self.stores, target, given=given, batch_size=batch_size, progress=progress)
        with self.lock:  # the warmer holds it only around lookups and writes, not its compute
            self.tokens_warmed += report.tokens
            self.finder.add(c.text for c in chunks)
        return report.keys

    def records(self, chunks: list[list[int]], lead_from: int | None = None,
                lead_weight: float = 1.0) -> list[ChunkRecord | None]:
        """The records a prompt's chunks (token ids, in prompt order) read, None for a miss; with
        lead records, the chunks from ``lead_from`` on read theirs (``StoreChain.prompt_records``),
        or with ``lead_weight`` below 1 their neighbour-warmed record moved that far toward it
        (``ChunkRecord.toward``; a chunk lacking either record reads the one it has)."""
        with self.lock:
            records = self.stores.prompt_records(chunks, self.record_keys, lead_from)
            if lead_from is None or lead_weight >= 1 or lead_from >= len(chunks):
                return records
            plain = self.stores.get_many([self.record_keys(ids)[0] for ids in chunks[lead_from:]])  # as warmed
        for i, near in enumerate(plain, start=lead_from):
            lead = records[i]
            if near is not None and lead is not None and near.key != lead.key:
                records[i] = near.toward(lead, lead_weight)
        return records

    # -- warm on miss ----------------------------------------------------------------------------
    def missed(self, texts: list[str]) -> None:
        """A prefill missed ``texts``: with warm on miss, known before any is warmed (so each is
        warmed behind its co-retrieved passages) and queued."""
        if self.misses is not None and texts:
            self.expect(texts)
            self.misses.offer(texts)

    def enable_warm_on_miss(self, limit: int = 256) -> None:
        """Turns warm on miss on (idempotent; ``BlendEngine(warm_on_miss=True)`` does at start): from
        now on each chunk a prefill finds in no tier is queued (at most ``limit`` waiting) and
        warmed on a background thread while no prefill or generation runs."""
        with self.lock:
            if self._background is None:
                self.misses = MissQueue(limit)
                self._background = BackgroundWarmer(self._warm_missed, self.misses, self.clock)

    def _warm_missed(self, texts: list[str]) -> list[ChunkKey]:
        """Into memory, the first attached local store (a folder) and every shared tier."""
        return self.warm(texts, next((t for t in self.stores.attached if not t.shared), None), progress=False)

    def warm_pending(self, timeout: float = 300.0) -> bool:
        return self._background is None or self._background.drain(timeout)

    def close(self) -> None:
        if self._background is not None:
            self._background.close()
