"""The warming pipeline: validate chunk texts, find those no store holds, batch-encode, store.

``BlendEngine.warm`` runs it: ``prepare`` validates every text before any compute (one bad text
stores nothing from its batch), then, under the engine's lock, ``store_missing`` encodes only the
chunks neither memory nor an attached store holds, batched by similar length, and writes each
record to memory, to the requested disk store and through to every attached Redis store (copying
records those stores lack). With ``BlendConfig.neighbours`` > 0 each chunk is computed behind
its most similar passages (``cacheblend.neighbours``), one chunk at a time; with ``lead_alone``
each chunk also gets its ``lead`` record, computed behind the chunk context alone. A neighbour
placed first in another chunk's context sits right behind the chunk context, so its rows there
are its lead record: it is taken from that forward for free, and only the chunks that are
nobody's first neighbour are computed alone (batched).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from collections.abc import Sequence

from .blending.encode import encode_padded
from .neighbours import behind
from .prompts.request import clean_chunk
from .stores import ChunkKey, ChunkRecord, DiskStore, compact

if TYPE_CHECKING:
    from .engine import BlendEngine


@dataclass(frozen=True)
class WarmChunk:
    """A validated chunk: its canonical text, token ids and store key (and the key of its lead
    record, warmed alone, when the engine keeps one)."""

    text: str
    ids: list[int]
    key: ChunkKey
    lead: ChunkKey | None = None


def prepare(engine: BlendEngine, texts) -> list[WarmChunk]:
    """Cleans, tokenizes and keys ``texts``; ValueError for an empty, non-text or over-long one."""
    cleaned = [clean_chunk(t) for t in texts]
    room = engine.max_chunk_tokens
    chunks = []
    for text in cleaned:
        ids = engine.encode_chunk(text).ids
        if len(ids) > room:
            raise ValueError(f"a chunk of {len(ids)} tokens exceeds the context window ({room}): {text[:60]!r}...")
        chunks.append(WarmChunk(text, ids, *engine.record_keys(ids)))
    return chunks


def given_neighbours(
    engine: BlendEngine, chunks: list[WarmChunk], neighbours: Sequence[Sequence[str]] | None
) -> dict[str, list[str]]:
    """Validates ``BlendEngine.warm``'s ``neighbours``: chunk text -> the passages it is computed
    behind (cleaned, blank ones dropped, at most ``config.neighbours``). A None entry leaves the
    choice to the engine's neighbour index."""
    if neighbours is None:
        return {}
    k = engine.neighbours
    if k == 0:
        raise ValueError("neighbours were given, but this engine warms chunks alone (BlendConfig.neighbours=0)")
    if isinstance(neighbours, str) or len(neighbours) != len(chunks):
        raise ValueError(f"neighbours must hold one list of texts per text warmed ({len(chunks)}), got {neighbours!r:.80}")
    out = {}
    for chunk, near in zip(chunks, neighbours):
        if near is None:
            continue
        if isinstance(near, str) or not all(isinstance(t, str) for t in near):
            raise ValueError(f"each entry of neighbours must be a list of texts, got {near!r:.80}")
        texts = (t.strip() for t in near)
        out[chunk.text] = [t for t in texts if t and t != chunk.text][:k]
    return out


def store_missing(
    engine: BlendEngine,
    chunks: list[WarmChunk],
    disk: DiskStore | None,
    batch_size: int,
    progress: bool | None,
    given: dict[str, list[str]] | None = None,
) -> None:
    """Computes the chunks no store holds; stored records that ``disk`` or an attached Redis store
    lacks are copied into it (Redis: one round trip asks which keys it lacks).

    ``progress``: a progress bar (default: when 16 or more chunks need computing).
    """
    wanted = [(c.key, c, False) for c in chunks] + [(c.lead, c, True) for c in chunks if c.lead]
    keys = list(dict.fromkeys(key for key, _, _ in wanted))
    lacking = {id(r): {k for k, there in zip(keys, r.contains_many(keys)) if not there} for r in engine.stores.remotes}
    todo: dict[str, WarmChunk] = {}  # key -> chunk, computed behind its neighbours (or alone)
    leads: dict[str, WarmChunk] = {}  # lead key -> chunk, computed behind the chunk context alone
    for key, chunk, lead in wanted:
        to_disk = disk is not None and key not in disk
        to_remote = [r for r in engine.stores.remotes if key in lacking[id(r)]]
        held = (disk is not None and not to_disk) or any(key not in lacking[id(r)] for r in engine.stores.remotes)
        if key in todo or key in leads or (held and not to_disk and not to_remote):
            continue
        record = engine.stores.get(key)
        if record is None:
            (leads if lead else todo)[key] = chunk
            continue
        if to_disk:
            disk.put(record)
        for remote in to_remote:
            remote.put(record)
    if engine.neighbours:
        _index(engine, chunks)
    _compute(engine, list(todo.values()), disk, batch_size, progress, given or {}, leads)


def _index(engine: BlendEngine, chunks: list[WarmChunk]) -> None:
    """Adds this call's chunks and every chunk the engine knows to its neighbour index."""
    index = engine.neighbour_index
    index.add([c.text for c in chunks], [c.ids for c in chunks])
    known = sorted(t for t in engine.finder if t not in index)
    index.add(known, [engine.encode_chunk(t).ids for t in known])


def _contexts(
    engine: BlendEngine, batch: list[WarmChunk], given: dict[str, list[str]]
) -> list[tuple[list[int], list[int] | None]]:
    """What each chunk of ``batch`` is computed behind: the chunk context, then (with
    ``config.neighbours``) its neighbours, given or found in the engine's neighbour index; with
    the ids of the neighbour placed first (right behind the chunk context), if any."""
    k = engine.neighbours
    if not k:
        return [(list(engine.context_ids), None)] * len(batch)
    index = engine.neighbour_index
    ask = [c for c in batch if c.text not in given]
    found = dict(zip((c.text for c in ask), index.nearest([c.ids for c in ask], k, exclude=[c.text for c in ask])))
    out = []
    for chunk in batch:
        texts = given[chunk.text] if chunk.text in given else found[chunk.text]
        ids = [index.ids(t) or engine.encode_chunk(t).ids for t in texts]  # given texts may be unindexed
        kept = behind(ids, len(engine.context_ids) + len(chunk.ids), engine.context_window)
        out.append(([*engine.context_ids, *(t for n in kept for t in n)], kept[0] if kept else None))
    return out


def _encode(
    engine: BlendEngine, batch: list[WarmChunk], given: dict[str, list[str]], leads: dict[str, WarmChunk]
) -> tuple[list, list[tuple[WarmChunk, object]]]:
    """Each chunk's KV, [layers, 2, kv_heads, T_padded, head_dim] per chunk: one padded batch
    behind the shared chunk context, or one chunk at a time behind its own neighbours. Also the
    lead records this took for free: (chunk, KV) of every first-placed neighbour whose lead
    record is wanted (it is then removed from ``leads``)."""
    contexts = _contexts(engine, batch, given)
    engine.tokens_warmed += sum(len(ctx) + len(c.ids) for (ctx, _), c in zip(contexts, batch))
    if not engine.neighbours:
        return list(encode_padded(engine.adapter, contexts[0][0], [c.ids for c in batch])), []
    out, free = [], []
    base = len(engine.context_ids)
    for (ctx, first), chunk in zip(contexts, batch):
        lead = leads.pop(engine.record_keys(first)[1], None) if first is not None and leads else None
        if lead is None:
            out.append(encode_padded(engine.adapter, ctx, [chunk.ids])[0])
            continue
        rows = encode_padded(engine.adapter, ctx[:base], [ctx[base:] + chunk.ids])[0]  # from the first neighbour on
        free.append((lead, rows[..., : len(first), :]))
        out.append(rows[..., len(ctx) - base :, :])
    return out, free


def _compute(
    engine: BlendEngine,
    todo: list[WarmChunk],
    disk: DiskStore | None,
    batch_size: int,
    progress: bool | None,
    given: dict[str, list[str]],
    leads: dict[str, WarmChunk],
) -> None:
    """Computes and stores ``todo`` (behind neighbours) and then the ``leads`` that computing it did
    not yield for free (alone, in padded batches)."""
    from tqdm.auto import tqdm

    order = sorted(todo, key=lambda c: len(c.ids))  # similar lengths pad less
    show = progress if progress is not None else len(order) + len(leads) >= 16
    with tqdm(total=len(order) + len(leads), desc="warming KV", unit="chunk", disable=not show) as bar:
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            batch_kv, free = _encode(engine, batch, given, leads)  # B x [L, 2, Hkv, T, d]
            _store(engine, disk, [(c.key, c, kv) for c, kv in zip(batch, batch_kv)] + [(c.lead, c, kv) for c, kv in free])
            bar.update(len(batch) + len(free))
        alone = sorted(leads.values(), key=lambda c: len(c.ids))
        for start in range(0, len(alone), batch_size):
            batch = alone[start : start + batch_size]
            engine.tokens_warmed += sum(len(engine.context_ids) + len(c.ids) for c in batch)
            batch_kv = encode_padded(engine.adapter, engine.context_ids, [c.ids for c in batch])
            _store(engine, disk, [(c.lead, c, kv) for c, kv in zip(batch, batch_kv)])
            bar.update(len(batch))


def _store(engine: BlendEngine, disk: DiskStore | None, computed: list[tuple[str, WarmChunk, object]]) -> None:
    """Writes (key, chunk, KV [L, 2, Hkv, >= tokens, d]) records to memory, ``disk`` and every Redis store."""
    dense, codec = compact.dense_dtype(engine.config.kv_dtype), compact.codec_for(engine.config.kv_dtype)
    records = []
    for key, chunk, kv in computed:
        stored = kv[..., : len(chunk.ids), :].to("cpu", dense).contiguous()  # [L, 2, Hkv, tokens, d]
        # int8: every tier holds what a disk or Redis read returns, so a hit is the same anywhere
        records.append(ChunkRecord(key, compact.roundtrip(stored, codec), chunk.text))
    for record in records:
        engine.stores.memory.put(record)
        if disk is not None:
            disk.put(record)
    for remote in engine.stores.remotes:
        remote.put_many(records)
