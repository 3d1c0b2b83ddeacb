"""The warming pipeline: validate chunk texts, find those no store holds, batch-encode, store.

``BlendEngine.warm`` runs it: ``prepare`` validates every text before any compute (one bad text
stores nothing from its batch), then, under the engine's lock, ``store_missing`` encodes only the
chunks neither memory nor an attached store holds, batched by similar length, and writes each
record to memory and to the requested disk store (copying records that store lacks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .blending.encode import encode_padded
from .models.loading import DTYPES
from .prompts.request import clean_chunk
from .stores import ChunkKey, ChunkRecord, DiskStore, chunk_key

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
    """Computes the chunks no store holds; stored records ``disk`` lacks are copied into it.

    ``progress``: a progress bar (default: when 16 or more chunks need computing).
    """
    todo: dict[str, WarmChunk] = {}
    for chunk in chunks:
        if chunk.key in todo or (disk is not None and chunk.key in disk):
            continue
        record = engine.stores.get(chunk.key)
        if record is None:
            todo[chunk.key] = chunk
        elif disk is not None:
            disk.put(record)
    _compute(engine, list(todo.values()), disk, batch_size, progress)


def _compute(
    engine: BlendEngine, todo: list[WarmChunk], disk: DiskStore | None, batch_size: int, progress: bool | None
) -> None:
    from tqdm.auto import tqdm

    order = sorted(todo, key=lambda c: len(c.ids))  # similar lengths pad less
    show = progress if progress is not None else len(order) >= 16
    kv_dtype = DTYPES[engine.config.kv_dtype]
    with tqdm(total=len(order), desc="warming KV", unit="chunk", disable=not show) as bar:
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            batch_kv = encode_padded(engine.adapter, engine.context_ids, [c.ids for c in batch])  # [B,L,2,Hkv,T,d]
            for chunk, kv in zip(batch, batch_kv):
                stored = kv[..., : len(chunk.ids), :].to("cpu", kv_dtype).contiguous()  # [L, 2, Hkv, tokens, d]
                record = ChunkRecord(chunk.key, stored, chunk.text)
                engine.stores.memory.put(record)
                if disk is not None:
                    disk.put(record)
            bar.update(len(batch))
