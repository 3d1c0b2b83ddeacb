"""The tiers one engine reads, in order: memory first, then the attached disk stores."""

from __future__ import annotations

from .disk import DiskStore
from .memory import MemoryStore
from .record import ChunkRecord


class StoreChain:
    """The stores one engine reads: memory first, then attached disk stores in order.

    A disk hit is promoted into memory. Writes name their disk store explicitly (see
    ``BlendEngine.warm``), so several vector indexes can each keep their KV beside themselves.
    """

    def __init__(self, memory: MemoryStore) -> None:
        self.memory = memory
        self.disks: list[DiskStore] = []

    def attach(self, disk: DiskStore) -> DiskStore:
        """Adds ``disk`` to the lookup chain (once per directory); returns the attached store."""
        for known in self.disks:
            if known.dir.resolve() == disk.dir.resolve():
                return known
        self.disks.append(disk)
        return disk

    def get(self, key: str) -> ChunkRecord | None:
        record = self.memory.get(key)
        for disk in self.disks:
            if record is not None:
                break
            record = disk.get(key)
            if record is not None:
                self.memory.put(record)
        return record

    def __contains__(self, key: str) -> bool:
        return key in self.memory or any(key in d for d in self.disks)
