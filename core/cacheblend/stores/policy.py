"""Which records a bounded tier keeps: recency and popularity (an aged-frequency policy with
TinyLFU-style admission), shared by the memory tier and a disk tier with a byte budget.

Retrieval is Zipf-skewed: a few chunks come back in most queries, most come back once. Plain LRU
lets every one-off chunk push a hot one out. This policy instead

- counts every lookup of a key, hit or miss (``touch``), so a chunk retrieved often but not yet
  stored is already known to be hot when it is finally put;
- ages the counts: every ``age_every`` lookups (default: 10 x the stored records, at least 1,024;
  W-TinyLFU's sample size) every count is halved and the zeros of keys not stored are dropped,
  so yesterday's hot set fades;
- bounds its bookkeeping: at most ``max_counters`` counted keys beyond the stored ones (past
  that the counts are aged early);
- evicts the stored key with the lowest (aged count, last lookup): the least popular, and of
  those the least recent;
- admits a new record into a full tier only if its count is >= that of every victim it would
  push out (``plan``): a one-off chunk never evicts a hot one. Replacing a stored key is always
  admitted.

The policy knows keys and byte sizes, not records: the tier does the storing and deleting. Its
measured hit rate against LRU and the static optimum is in tests/core/test_store_policy.py.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable


class Policy:
    """Byte-budget bookkeeping for one tier: counts, recency, sizes, victims, admission.

    ``clock``: what "recent" is measured in (default: a lookup counter; a disk tier passes
    ``time.time`` so that file mtimes and lookups compare).
    """

    def __init__(
        self,
        max_bytes: int,
        *,
        max_counters: int = 1 << 16,
        age_every: int | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        if max_counters < 1:
            raise ValueError(f"max_counters must be >= 1, got {max_counters}")
        self.max_bytes, self.max_counters, self.age_every = max_bytes, max_counters, age_every
        self._clock = clock if clock is not None else itertools.count().__next__
        self._counts: dict[str, int] = {}
        self._stored: dict[str, tuple[int, float]] = {}  # key -> (nbytes, last lookup)
        self._heap: list[tuple[int, float, str]] = []  # (count, last, key); stale entries skipped
        self._since_age = 0
        self.nbytes = 0

    # -- what the tier reports ------------------------------------------------------------------
    def touch(self, key: str) -> None:
        """One lookup of ``key`` (a hit or a miss)."""
        self._counts[key] = self._counts.get(key, 0) + 1
        self._since_age += 1
        if key in self._stored:
            self._stored[key] = (self._stored[key][0], self._clock())
            self._push(key)
        period = self.age_every or max(1024, 10 * len(self._stored))
        if self._since_age >= period or len(self._counts) > self.max_counters + len(self._stored):
            self.age()

    def add(self, key: str, nbytes: int, last: float | None = None) -> None:
        """``key`` is now stored (``nbytes``; ``last``: when it was last used, default now)."""
        self.remove(key)
        self._stored[key] = (nbytes, self._clock() if last is None else last)
        self.nbytes += nbytes
        self._push(key)

    def remove(self, key: str) -> None:
        """``key`` is no longer stored (its count stays: it may come back)."""
        old = self._stored.pop(key, None)
        if old is not None:
            self.nbytes -= old[0]

    def sync(self, present: dict[str, tuple[int, float]]) -> None:
        """What is stored, as seen now (key -> (nbytes, mtime)), e.g. a folder other processes
        write too: keys gone are removed, new ones added with that recency, sizes corrected."""
        for key in [k for k in self._stored if k not in present]:
            self.remove(key)
        for key, (nbytes, last) in present.items():
            known = self._stored.get(key)
            if known is None:
                self.add(key, nbytes, last)
            elif known[0] != nbytes:
                self.add(key, nbytes, known[1])

    # -- what the tier asks ---------------------------------------------------------------------
    def count(self, key: str) -> int:
        """The aged lookup count of ``key``."""
        return self._counts.get(key, 0)

    def __contains__(self, key: str) -> bool:
        return key in self._stored

    def __len__(self) -> int:
        return len(self._stored)

    def keys(self) -> Iterable[str]:
        return self._stored.keys()

    def plan(self, key: str, nbytes: int) -> list[str] | None:
        """The stored keys to evict so that ``key`` (``nbytes``) fits the budget, least valuable
        first, or None when it must not be stored: larger than the whole budget, or some victim
        looked up more often than it (admission). Changes nothing."""
        if nbytes > self.max_bytes:
            return None
        have = self._stored.get(key)
        need = nbytes - (self.max_bytes - self.nbytes + (have[0] if have else 0))
        victims: list[str] = []
        popped: list[tuple[int, float, str]] = []
        try:
            while need > 0 and (entry := self._pop_valid(popped)) is not None:
                count, _, victim = entry
                if victim == key:
                    continue
                if have is None and count > self.count(key):
                    return None
                victims.append(victim)
                need -= self._stored[victim][0]
        finally:
            for entry in popped:
                heapq.heappush(self._heap, entry)
        return victims

    def over_budget(self) -> list[str]:
        """The stored keys to evict to get back within the budget (after ``sync`` found more)."""
        victims: list[str] = []
        popped: list[tuple[int, float, str]] = []
        excess = self.nbytes - self.max_bytes
        while excess > 0 and (entry := self._pop_valid(popped)) is not None:
            victims.append(entry[2])
            excess -= self._stored[entry[2]][0]
        for entry in popped:
            heapq.heappush(self._heap, entry)
        return victims

    # -- internals ------------------------------------------------------------------------------
    def age(self) -> None:
        """Halves every count; drops the zeros of keys not stored (repeats while over the cap)."""
        self._since_age = 0
        while True:
            self._counts = {k: c >> 1 for k, c in self._counts.items() if c > 1 or k in self._stored}
            extra = len(self._counts) - len(self._stored)
            if extra <= self.max_counters or not any(c for k, c in self._counts.items() if k not in self._stored):
                break
        self._rebuild()

    def _push(self, key: str) -> None:
        heapq.heappush(self._heap, (self.count(key), self._stored[key][1], key))
        if len(self._heap) > 2 * len(self._stored) + 64:
            self._rebuild()

    def _rebuild(self) -> None:
        self._heap = [(self.count(k), last, k) for k, (_, last) in self._stored.items()]
        heapq.heapify(self._heap)

    def _pop_valid(self, popped: list[tuple[int, float, str]]) -> tuple[int, float, str] | None:
        """The heap's least valuable entry that still describes a stored key not in ``popped``,
        popped and appended to ``popped`` (the caller pushes them back)."""
        while self._heap:
            entry = heapq.heappop(self._heap)
            count, last, key = entry
            held = self._stored.get(key)
            if held is not None and held[1] == last and self.count(key) == count:
                if entry in popped:
                    continue  # a duplicate entry (re-added with the same count and time)
                popped.append(entry)
                return entry
        return None
