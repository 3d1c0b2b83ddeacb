"""The warming pipeline: validate chunk texts, find those no tier holds, compute their KV, store.

A ``Warmer`` is built once per engine from what it needs and nothing else: the model adapter,
a tokenizer function (text -> chunk ids), the record keys, the neighbour index, the ``WarmSetup`` (what the KV is
computed behind) and the lock that guards the tiers and the index: it is held to look records up,
to pick neighbours and to store, never while the model computes, so a prefill never waits for a
warm's compute. ``prepare`` validates every text before any compute (one bad text stores
nothing), then ``run`` computes only the records that neither memory nor any tier holds, writes
them to memory, to the tier the caller names and through to every shared tier, copies stored
records into those tiers where they lack them, and returns a ``WarmReport``.

With ``WarmSetup.neighbours`` > 0 each chunk is computed behind its most similar passages
(``cacheblend.neighbours``), one chunk at a time; with lead records (``RecordKeys.lead_alone``)
each chunk also gets its ``lead`` record, computed behind the chunk context alone. A neighbour
placed first in another chunk's context sits right behind the chunk context, so its rows there
are its lead record: it is taken from that forward for free, and only the chunks that are
nobody's first neighbour are computed alone (batched).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from .blending.warm_forward import forward_padded
from .models.adapter import ModelAdapter
from .neighbours import NeighbourIndex, behind
from .prompts.request import clean_chunk
from .stores import ChunkKey, ChunkRecord, KVTier, RecordKeys, StoreChain, compact


@dataclass(frozen=True)
class WarmSetup:
    """What a chunk's KV is computed behind, fixed per engine (it keys the KV): the chunk context's
    ids, how many similar passages follow it, the stored dtype, and the context window."""

    context_ids: tuple[int, ...]
    neighbours: int
    kv_dtype: str
    context_window: int


@dataclass(frozen=True)
class WarmChunk:
    """A validated chunk: its canonical text, token ids and store key (and the key of its lead
    record, warmed alone, when the engine keeps one)."""

    text: str
    ids: list[int]
    key: ChunkKey
    lead: ChunkKey | None = None


@dataclass
class WarmReport:
    """What one ``Warmer.run`` did: the chunks' keys in order, records computed and copied into a
    tier that lacked them, and the tokens computed (chunk contexts and neighbours included)."""

    keys: list[ChunkKey]
    computed: int = 0
    copied: int = 0
    tokens: int = 0


@dataclass
class _Todo:
    """One run's work: records to compute behind neighbours, lead records to compute alone."""

    plain: dict[ChunkKey, WarmChunk] = field(default_factory=dict)
    leads: dict[ChunkKey, WarmChunk] = field(default_factory=dict)


class Warmer:
    """Computes and stores chunk KV for one model and one ``WarmSetup``."""

    def __init__(
        self,
        adapter: ModelAdapter,
        tokenize: Callable[[str], list[int]],
        keys: RecordKeys,
        index: NeighbourIndex,
        setup: WarmSetup,
        lock: threading.RLock | None = None,
    ) -> None:
        self.adapter, self.tokenize, self.keys, self.index, self.setup = adapter, tokenize, keys, index, setup
        self.lock = lock or threading.RLock()

    @property
    def max_chunk_tokens(self) -> int:
        """The longest chunk accepted: the context window minus the chunk context."""
        return self.setup.context_window - len(self.setup.context_ids)

    def prepare(self, texts: Iterable[str]) -> list[WarmChunk]:
        """Cleans, tokenizes and keys ``texts``; ValueError for an empty, non-text or over-long one."""
        cleaned = [clean_chunk(t) for t in texts]
        room = self.max_chunk_tokens
        chunks = []
        for text in cleaned:
            ids = self.tokenize(text)
            if len(ids) > room:
                raise ValueError(f"a chunk of {len(ids)} tokens exceeds the context window ({room}): {text[:60]!r}...")
            chunks.append(WarmChunk(text, ids, *self.keys(ids)))
        return chunks

    def given_behind(
        self, chunks: list[WarmChunk], lists: Sequence[Sequence[str] | None] | None
    ) -> dict[str, list[str]]:
        """Validates the caller's ``behind`` lists: chunk text -> the passages it is computed behind
        (cleaned, blank ones dropped, at most ``setup.neighbours``). A None entry leaves the
        choice to the neighbour index."""
        if lists is None:
            return {}
        k = self.setup.neighbours
        if k == 0:
            raise ValueError("behind was given, but this engine warms chunks alone (BlendConfig.neighbours=0)")
        if isinstance(lists, str) or len(lists) != len(chunks):
            raise ValueError(f"behind must hold one list of texts per text warmed ({len(chunks)}), got {lists!r:.80}")
        out = {}
        for chunk, near in zip(chunks, lists):
            if near is None:
                continue
            if isinstance(near, str) or not all(isinstance(t, str) for t in near):
                raise ValueError(f"each entry of behind must be a list of texts, got {near!r:.80}")
            texts = (t.strip() for t in near)
            out[chunk.text] = [t for t in texts if t and t != chunk.text][:k]
        return out

    def learn(self, chunks: list[WarmChunk], known: Iterable[str]) -> None:
        """Adds ``chunks`` and the ``known`` chunk texts to the neighbour index."""
        self.index.add([c.text for c in chunks], [c.ids for c in chunks])
        rest = sorted(t for t in known if t not in self.index)
        self.index.add(rest, [self.tokenize(t) for t in rest])

    def run(
        self,
        chunks: list[WarmChunk],
        tiers: StoreChain,
        target: KVTier | None = None,
        *,
        given: dict[str, list[str]] | None = None,
        batch_size: int = 8,
        progress: bool | None = None,
    ) -> WarmReport:
        """Computes the records no tier holds and writes them to memory, ``target`` and every
        shared tier; stored records that ``target`` or a shared tier lacks are copied into it (one
        ``contains_many`` per tier asks which). ``progress``: a progress bar (default: when 16
        or more records need computing); ``batch_size`` >= 1 chunks per forward."""
        writes = list({t.location: t for t in [target, *tiers.shared] if t is not None}.values())
        report = WarmReport([c.key for c in chunks])
        with self.lock:
            todo = self._missing(chunks, tiers, writes, report)
        self._compute(todo, [tiers.memory, *writes], given or {}, batch_size, progress, report)
        return report

    def _missing(self, chunks: list[WarmChunk], tiers: StoreChain, writes: list[KVTier], report: WarmReport) -> _Todo:
        """The records to compute; copies the stored ones into the ``writes`` tiers that lack them."""
        wanted = [(c.key, c, False) for c in chunks] + [(c.lead, c, True) for c in chunks if c.lead]
        keys = list(dict.fromkeys(key for key, _, _ in wanted))
        lacking = {t.location: {k for k, there in zip(keys, t.contains_many(keys)) if not there} for t in writes}
        todo = _Todo()
        for key, chunk, lead in wanted:
            lack = [t for t in writes if key in lacking[t.location]]
            if key in todo.plain or key in todo.leads or (writes and not lack):
                continue
            record = tiers.get(key)
            if record is None:
                (todo.leads if lead else todo.plain)[key] = chunk
                continue
            for tier in lack:
                tier.put_many([record])
                report.copied += 1
        return todo

    def _compute(self, todo: _Todo, writes: list[KVTier], given, batch_size: int, progress, report: WarmReport) -> None:
        """Computes ``todo.plain`` (behind neighbours) and then the lead records that computing it
        did not yield for free (alone, in padded batches)."""
        from tqdm.auto import tqdm

        order = sorted(todo.plain.values(), key=lambda c: len(c.ids))  # similar lengths pad less
        show = progress if progress is not None else len(order) + len(todo.leads) >= 16
        ctx = list(self.setup.context_ids)
        with tqdm(total=len(order) + len(todo.leads), desc="warming KV", unit="chunk", disable=not show) as bar:
            for start in range(0, len(order), batch_size):
                batch = order[start : start + batch_size]
                computed = self._forward(batch, given, todo.leads, report)
                self._store(writes, computed, report)
                bar.update(len(computed))
            alone = sorted(todo.leads.values(), key=lambda c: len(c.ids))
            for start in range(0, len(alone), batch_size):
                batch = alone[start : start + batch_size]
                report.tokens += sum(len(ctx) + len(c.ids) for c in batch)
                kv = forward_padded(self.adapter, ctx, [c.ids for c in batch])
                self._store(writes, [(c.lead, c, rows) for c, rows in zip(batch, kv)], report)
                bar.update(len(batch))

    def _contexts(self, batch: list[WarmChunk], given: dict[str, list[str]]) -> list[tuple[list[int], list[int] | None]]:
        """What each chunk of ``batch`` is computed behind: the chunk context, then (with
        ``setup.neighbours``) its neighbours, given or found in the neighbour index; with the ids
        of the neighbour placed first (right behind the chunk context), if any."""
        if not self.setup.neighbours:
            return [(list(self.setup.context_ids), None)] * len(batch)
        found = self.nearest([c for c in batch if c.text not in given])
        return [self.place(c, given[c.text] if c.text in given else found[c.text]) for c in batch]

    def nearest(self, batch: list[WarmChunk], index: NeighbourIndex | None = None) -> dict[str, list[str]]:
        """Chunk text -> its ``setup.neighbours`` most similar texts in ``index`` (the engine's by
        default), the batch's own texts left out: what a warm of ``batch`` is computed behind."""
        index = self.index if index is None else index
        exclude = [c.text for c in batch]
        return dict(zip(exclude, index.nearest([c.ids for c in batch], self.setup.neighbours, exclude=exclude)))

    def place(
        self, chunk: WarmChunk, texts: Sequence[str], index: NeighbourIndex | None = None
    ) -> tuple[list[int], list[int] | None]:
        """What ``chunk`` is computed behind: the chunk context, then as many of the neighbour
        ``texts`` as fit in the context window; with the ids of the one placed first, if any."""
        index, ctx = self.index if index is None else index, list(self.setup.context_ids)
        ids = [index.ids(t) or self.tokenize(t) for t in texts]  # given texts may be unindexed
        kept = behind(ids, len(ctx) + len(chunk.ids), self.setup.context_window)
        return [*ctx, *(t for n in kept for t in n)], kept[0] if kept else None

    def _forward(
        self, batch: list[WarmChunk], given: dict[str, list[str]], leads: dict[ChunkKey, WarmChunk], report: WarmReport
    ) -> list[tuple[ChunkKey, WarmChunk, torch.Tensor]]:
        """(key, chunk, KV [layers, 2, kv_heads, >= tokens, head_dim]) of every chunk of ``batch``:
        one padded batch behind the shared chunk context, or one chunk at a time behind its own
        neighbours; plus the lead records this yields for free (every first-placed neighbour whose
        lead record is still to compute: it is taken off ``leads``)."""
        with self.lock:
            contexts = self._contexts(batch, given)
        report.tokens += sum(len(ctx) + len(c.ids) for (ctx, _), c in zip(contexts, batch))
        if not self.setup.neighbours:
            return [(c.key, c, kv) for c, kv in zip(batch, forward_padded(self.adapter, contexts[0][0], [c.ids for c in batch]))]
        out, free = [], []
        base = len(self.setup.context_ids)
        for (ctx, first), chunk in zip(contexts, batch):
            lead = leads.pop(self.keys(first)[1], None) if first is not None and leads else None
            if lead is None:
                out.append((chunk.key, chunk, forward_padded(self.adapter, ctx, [chunk.ids])[0]))
                continue
            rows = forward_padded(self.adapter, ctx[:base], [ctx[base:] + chunk.ids])[0]  # from the first neighbour on
            free.append((lead.lead, lead, rows[..., : len(first), :]))
            out.append((chunk.key, chunk, rows[..., len(ctx) - base :, :]))
        return out + free

    def _store(self, writes: list[KVTier], computed: list[tuple[ChunkKey, WarmChunk, torch.Tensor]], report: WarmReport) -> None:
        """Writes the computed records to every tier of ``writes`` (memory first)."""
        dense, codec = compact.dense_dtype(self.setup.kv_dtype), compact.codec_for(self.setup.kv_dtype)
        records = []
        for key, chunk, kv in computed:
            stored = kv[..., : len(chunk.ids), :].to("cpu", dense).contiguous()  # [L, 2, Hkv, tokens, d]
            # int8: every tier holds what a disk or Redis read returns, so a hit is the same anywhere
            records.append(ChunkRecord(key, compact.roundtrip(stored, codec), chunk.text))
        with self.lock:
            for tier in writes:
                tier.put_many(records)
        report.computed += len(records)
