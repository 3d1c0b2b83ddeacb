"""The tiers one engine reads, in order: memory, local tiers, shared tiers."""

from __future__ import annotations

from collections.abc import Sequence

from .keys import ChunkKey, RecordKeys
from .memory import MemoryStore
from .record import ChunkRecord
from .tier import KVTier


class StoreChain:
    """The tiers one engine reads: its memory tier, then the attached local tiers (folders), then
    the shared ones (servers), each group in attach order.

    A hit in a slower tier is promoted into memory (never into a persistent tier: writing files on
    the query path would cost a query an fsync; warming fills those). Each attached tier is asked
    once per lookup for every chunk still missing (one round trip for a server).
    """

    def __init__(self, memory: MemoryStore) -> None:
        self.memory = memory
        self.attached: list[KVTier] = []

    @property
    def tiers(self) -> list[KVTier]:
        """Every tier in read order, memory first."""
        return [self.memory, *self.attached]

    @property
    def shared(self) -> list[KVTier]:
        """The attached tiers other processes read too: warming writes through to each."""
        return [t for t in self.attached if t.shared]

    def attach(self, tier: KVTier) -> KVTier:
        """Adds ``tier`` to the lookup order (once per location); returns the attached one."""
        known = next((t for t in self.attached if t.location == tier.location), None)
        if known is not None:
            return known
        # local tiers before shared ones (a folder answers faster than a server)
        at = next((i for i, t in enumerate(self.attached) if t.shared and not tier.shared), len(self.attached))
        self.attached.insert(at, tier)
        return tier

    def get(self, key: ChunkKey) -> ChunkRecord | None:
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[ChunkKey]) -> list[ChunkRecord | None]:
        """The records of ``keys`` (a prompt's chunks), each from the fastest tier that has it."""
        found: dict[ChunkKey, ChunkRecord | None] = dict(zip(keys, self.memory.get_many(keys)))
        for tier in self.attached:
            missing = [k for k, rec in found.items() if rec is None]
            if not missing:
                break
            for key, record in zip(missing, tier.get_many(missing)):
                if record is not None:
                    self.memory.put(record)
                found[key] = record
        return [found[k] for k in keys]

    def prompt_records(self, chunks: Sequence[Sequence[int]], keys: RecordKeys,
                       lead_from: int | None = None) -> list[ChunkRecord | None]:
        """The records a prompt's chunks (token ids, in prompt order) read, in two lookups at most.
        With lead records (``keys.lead_alone``) the first chunk reads its ``lead`` record (warmed
        alone: nothing but the prompt's head precedes it), and so does every chunk from
        ``lead_from`` on; the others read their records warmed behind neighbours. A chunk lacking
        the record its place asks for uses its other one."""
        lead_at = [i == 0 or (lead_from is not None and i >= lead_from) for i in range(len(chunks))]
        pairs = [keys(ids) for ids in chunks]  # (as warmed, lead or None) per chunk
        records = self.get_many([lead if at and lead else plain for at, (plain, lead) in zip(lead_at, pairs)])
        missing = [i for i, r in enumerate(records) if r is None and pairs[i][1]]
        if missing:
            other = [pairs[i][0] if lead_at[i] else pairs[i][1] for i in missing]  # the record its place did not ask for
            for i, record in zip(missing, self.get_many(other)):
                records[i] = record
        return records

    def __contains__(self, key: ChunkKey) -> bool:
        return any(t.contains_many([key])[0] for t in self.tiers)
