"""The tiers one engine reads, in order: memory, then the attached disk stores, then Redis."""

from __future__ import annotations

from collections.abc import Sequence

from .disk import DiskStore
from .memory import MemoryStore
from .record import ChunkRecord
from .redis import RedisStore


class StoreChain:
    """The stores one engine reads: memory first, then attached disk stores, then attached Redis
    stores, in attach order.

    A hit in a slower tier is promoted into memory (not into a disk store: writing files on the
    query path would cost a query an fsync; ``warm`` fills disk stores). Disk writes name their store
    explicitly (see ``BlendEngine.warm``), so several vector indexes can each keep their KV beside
    themselves; Redis stores are shared by every process, so warming writes through to all of them.
    """

    def __init__(self, memory: MemoryStore) -> None:
        self.memory = memory
        self.disks: list[DiskStore] = []
        self.remotes: list[RedisStore] = []

    def attach(self, store: DiskStore | RedisStore) -> DiskStore | RedisStore:
        """Adds ``store`` to the lookup chain (once per directory or URL); returns the attached one."""
        if isinstance(store, RedisStore):
            known = next((r for r in self.remotes if r.url == store.url and r.prefix == store.prefix), None)
            if known is None:
                self.remotes.append(store)
            return known or store
        for known in self.disks:
            if known.dir.resolve() == store.dir.resolve():
                return known
        self.disks.append(store)
        return store

    def get(self, key: str) -> ChunkRecord | None:
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[str]) -> list[ChunkRecord | None]:
        """The records of ``keys`` (a prompt's chunks), each from the fastest tier that has it;
        every Redis store is asked once for all the chunks still missing (one round trip)."""
        found: dict[str, ChunkRecord | None] = {k: self.memory.get(k) for k in keys}
        for disk in self.disks:
            for key in [k for k, rec in found.items() if rec is None]:
                found[key] = self._promote(disk.get(key))
        for remote in self.remotes:
            missing = [k for k, rec in found.items() if rec is None]
            if not missing:
                break
            for key, record in zip(missing, remote.get_many(missing)):
                found[key] = self._promote(record)
        return [found[k] for k in keys]

    def _promote(self, record: ChunkRecord | None) -> ChunkRecord | None:
        if record is not None:
            self.memory.put(record)
        return record

    def __contains__(self, key: str) -> bool:
        return key in self.memory or any(key in d for d in self.disks) or any(key in r for r in self.remotes)
