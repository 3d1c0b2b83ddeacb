"""The warming pipeline: validate chunk texts, find those no store holds, batch-encode, store.

``BlendEngine.warm`` runs it: ``prepare`` validates every text before any compute (one bad text
stores nothing from its batch), then, under the engine's lock, ``store_missing`` encodes only the
chunks neither memory nor an attached store holds, batched by similar length, and writes each
record to memory, to the requested disk store and through to every attached Redis store (copying
records those stores lack).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .blending.encode import encode_padded
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


def store_missing(
    engine: BlendEngine, chunks: list[WarmChunk], disk: DiskStore | None, batch_size: int, progress: bool | None
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
    _compute(engine, list(todo.values()), disk, batch_size, progress)


def _compute(
    engine: BlendEngine, todo: list[WarmChunk], disk: DiskStore | None, batch_size: int, progress: bool | None
) -> None:
    from tqdm.auto import tqdm

    order = sorted(todo, key=lambda c: len(c.ids))  # similar lengths pad less
    show = progress if progress is not None else len(order) >= 16
    dense, codec = compact.dense_dtype(engine.config.kv_dtype), compact.codec_for(engine.config.kv_dtype)
    with tqdm(total=len(order), desc="warming KV", unit="chunk", disable=not show) as bar:
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            batch_kv = encode_padded(engine.adapter, engine.context_ids, [c.ids for c in batch])  # [B,L,2,Hkv,T,d]
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
