"""The in-process store tier: a byte budget with least-recently-used eviction."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from .record import ChunkRecord


class MemoryStore:
    """In-process store with a byte budget and least-recently-used eviction (an evicted chunk is
    a later miss, recomputed, never an error)."""

    shared = False
    location = "memory"

    def __init__(self, max_bytes: int = 2 << 30) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.max_bytes = max_bytes
        self._records: OrderedDict[str, ChunkRecord] = OrderedDict()
        self.nbytes = 0

    def get(self, key: str) -> ChunkRecord | None:
        record = self._records.get(key)
        if record is not None:
            self._records.move_to_end(key)
        return record

    def put(self, record: ChunkRecord) -> None:
        if record.nbytes > self.max_bytes:
            return  # larger than the whole budget: not kept
        old = self._records.pop(record.key, None)
        self.nbytes -= old.nbytes if old is not None else 0
        self._records[record.key] = record
        self.nbytes += record.nbytes
        while self.nbytes > self.max_bytes:
            _, evicted = self._records.popitem(last=False)
            self.nbytes -= evicted.nbytes

    def get_many(self, keys: Sequence[str]) -> list[ChunkRecord | None]:
        return [self.get(k) for k in keys]

    def put_many(self, records: Sequence[ChunkRecord]) -> None:
        for record in records:
            self.put(record)

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        return [k in self._records for k in keys]

    def texts(self) -> Iterable[str]:
        return [r.text for r in self._records.values()]

    def __contains__(self, key: str) -> bool:
        return key in self._records

    def __len__(self) -> int:
        return len(self._records)
