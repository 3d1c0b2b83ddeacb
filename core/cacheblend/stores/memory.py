"""The in-process store tier: a byte budget kept by recency and popularity (``stores.policy``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .policy import Policy
from .record import ChunkRecord


class MemoryStore:
    """In-process store with a byte budget. Every lookup (hit or miss) is counted; when full, the
    least looked-up record (of those, the least recent) is evicted, and a new record is admitted
    only if it was looked up at least as often as what it would evict (``stores.policy``). An
    evicted or refused chunk is a later miss, recomputed, never an error.

    Counters (plain ints, since creation): ``hits``, ``misses`` (``get``/``get_many``),
    ``evictions`` (records pushed out), ``rejected`` (puts refused by admission or larger than the
    whole budget).
    """

    shared = False
    location = "memory"

    def __init__(self, max_bytes: int = 2 << 30) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.max_bytes = max_bytes
        self.policy = Policy(max_bytes)
        self._records: dict[str, ChunkRecord] = {}
        self.hits = self.misses = self.evictions = self.rejected = 0

    @property
    def nbytes(self) -> int:
        return self.policy.nbytes

    def get(self, key: str) -> ChunkRecord | None:
        self.policy.touch(key)
        record = self._records.get(key)
        if record is None:
            self.misses += 1
        else:
            self.hits += 1
        return record

    def put(self, record: ChunkRecord) -> None:
        victims = self.policy.plan(record.key, record.nbytes)
        if victims is None:
            self.rejected += 1
            return
        for key in victims:
            del self._records[key]
            self.policy.remove(key)
        self.evictions += len(victims)
        self._records[record.key] = record
        self.policy.add(record.key, record.nbytes)

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
