"""The warming pipeline: validate chunk texts, find those no store holds, batch-encode, store.

``BlendEngine.warm`` runs it: ``prepare`` validates every text before any compute (one bad text
stores nothing from its batch), then, under the engine's lock, ``store_missing`` encodes only the
chunks neither memory nor an attached store holds, batched by similar length, and writes each
record to memory, to the requested disk store and through to every attached Redis store (copying
records those stores lack). With ``BlendConfig.neighbours`` > 0 each chunk is computed behind
its most similar passages (``cacheblend.neighbours``), one chunk at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from collections.abc import Sequence

from .blending.encode import encode_padded
from .neighbours import behind
from .prompts.request import clean_chunk
from .stores import ChunkKey, ChunkRecord, DiskStore, chunk_key, compact

if TYPE_CHECKING:
    from .engine import BlendEngine


@dataclass(frozen=True)
class WarmChunk:
    """A validated chunk: its canonical text, token ids and store key."""

    text: str
    ids: list[int]
    key: ChunkKey


def prepare(engine: BlendEngine, texts) -> list[WarmChunk]:
    """Cleans, tokenizes and keys ``texts``; ValueError for an empty, non-text or over-long one."""
    cleaned = [clean_chunk(t) for t in texts]
    room = engine.max_chunk_tokens
    chunks = []
    for text in cleaned:
        ids = engine.encode_chunk(text).ids
        if len(ids) > room:
            raise ValueError(f"a chunk of {len(ids)} tokens exceeds the context window ({room}): {text[:60]!r}...")
        chunks.append(WarmChunk(text, ids, chunk_key(engine.fingerprint, ids)))
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
    keys = list(dict.fromkeys(c.key for c in chunks))
    lacking = {id(r): {k for k, there in zip(keys, r.contains_many(keys)) if not there} for r in engine.stores.remotes}
    todo: dict[str, WarmChunk] = {}
    for chunk in chunks:
        to_disk = disk is not None and chunk.key not in disk
        to_remote = [r for r in engine.stores.remotes if chunk.key in lacking[id(r)]]
        held = (disk is not None and not to_disk) or any(chunk.key not in lacking[id(r)] for r in engine.stores.remotes)
        if chunk.key in todo or (held and not to_disk and not to_remote):
            continue
        record = engine.stores.get(chunk.key)
        if record is None:
            todo[chunk.key] = chunk
            continue
        if to_disk:
            disk.put(record)
        for remote in to_remote:
            remote.put(record)
    if engine.neighbours:
        _index(engine, chunks)
    _compute(engine, list(todo.values()), disk, batch_size, progress, given or {})


def _index(engine: BlendEngine, chunks: list[WarmChunk]) -> None:
    """Adds this call's chunks and every chunk the engine knows to its neighbour index."""
    index = engine.neighbour_index
    index.add([c.text for c in chunks], [c.ids for c in chunks])
    known = sorted(t for t in engine.finder if t not in index)
    index.add(known, [engine.encode_chunk(t).ids for t in known])


def _contexts(engine: BlendEngine, batch: list[WarmChunk], given: dict[str, list[str]]) -> list[list[int]]:
    """The ids each chunk of ``batch`` is computed behind: the chunk context, then (with
    ``config.neighbours``) its neighbours, given or found in the engine's neighbour index."""
    k = engine.neighbours
    if not k:
        return [list(engine.context_ids)] * len(batch)
    index = engine.neighbour_index
    ask = [c for c in batch if c.text not in given]
    found = dict(zip((c.text for c in ask), index.nearest([c.ids for c in ask], k, exclude=[c.text for c in ask])))
    out = []
    for chunk in batch:
        texts = given[chunk.text] if chunk.text in given else found[chunk.text]
        ids = [index.ids(t) or engine.encode_chunk(t).ids for t in texts]  # given texts may be unindexed
        out.append(behind(engine.context_ids, ids, len(chunk.ids), engine.context_window))
    return out


def _encode(engine: BlendEngine, batch: list[WarmChunk], given: dict[str, list[str]]) -> list:
    """Each chunk's KV, [layers, 2, kv_heads, T_padded, head_dim] per chunk: one padded batch
    behind the shared chunk context, or one chunk at a time behind its own neighbours."""
    contexts = _contexts(engine, batch, given)
    engine.tokens_warmed += sum(len(ctx) + len(c.ids) for ctx, c in zip(contexts, batch))
    if not engine.neighbours:
        return list(encode_padded(engine.adapter, contexts[0], [c.ids for c in batch]))
    return [encode_padded(engine.adapter, ctx, [c.ids])[0] for ctx, c in zip(contexts, batch)]


def _compute(
    engine: BlendEngine,
    todo: list[WarmChunk],
    disk: DiskStore | None,
    batch_size: int,
    progress: bool | None,
    given: dict[str, list[str]],
) -> None:
    from tqdm.auto import tqdm

    order = sorted(todo, key=lambda c: len(c.ids))  # similar lengths pad less
    show = progress if progress is not None else len(order) >= 16
    dense, codec = compact.dense_dtype(engine.config.kv_dtype), compact.codec_for(engine.config.kv_dtype)
    with tqdm(total=len(order), desc="warming KV", unit="chunk", disable=not show) as bar:
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            batch_kv = _encode(engine, batch, given)  # B x [L, 2, Hkv, T, d]
            records = []
            for chunk, kv in zip(batch, batch_kv):
                stored = kv[..., : len(chunk.ids), :].to("cpu", dense).contiguous()  # [L, 2, Hkv, tokens, d]
                # int8: every tier holds what a disk or Redis read returns, so a hit is the same anywhere
                records.append(ChunkRecord(chunk.key, compact.roundtrip(stored, codec), chunk.text))
            for record in records:
                engine.stores.memory.put(record)
                if disk is not None:
                    disk.put(record)
            for remote in engine.stores.remotes:
                remote.put_many(records)
            bar.update(len(batch))
