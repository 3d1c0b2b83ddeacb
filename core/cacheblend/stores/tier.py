"""What every store tier is, and how a location names one.

A tier is an object with the five members of ``KVTier``; every failure inside one is a miss
(or a skipped write) with a ``StoreWarning``, never an exception on the query path. ``open_tier``
maps where a store lives to its tier: a URL scheme in ``SCHEMES`` (``redis://`` ... : a tier every
process attached to it shares) or else a folder (a disk store). A new tier is one module here
with a class of these members and one line in ``SCHEMES``; nothing else in the package changes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, runtime_checkable

from .disk import DiskStore
from .keys import ChunkKey
from .record import ChunkRecord
from .redis import SCHEMES as REDIS_SCHEMES
from .redis import RedisStore


@runtime_checkable
class KVTier(Protocol):
    """One place chunk records are kept."""

    #: True when other processes read this tier too (Redis): warming writes through to it.
    #: False for a tier one caller fills on purpose (a disk store beside a vector index).
    shared: bool
    #: Where it lives, one spelling per place (a resolved folder, a URL and key prefix): two
    #: attachments of the same location are one tier.
    location: str

    def get_many(self, keys: Sequence[ChunkKey]) -> list[ChunkRecord | None]: ...

    def put_many(self, records: Sequence[ChunkRecord]) -> None: ...

    def contains_many(self, keys: Sequence[ChunkKey]) -> list[bool]: ...

    def texts(self) -> Iterable[str]:
        """The chunk texts stored here (a new process learns from them what to look for in prompts)."""
        ...


#: URL scheme (as written before ``://``) -> the tier that opens it; anything else is a folder.
SCHEMES: dict[str, Callable[[str, str, str], KVTier]] = {
    **{scheme.removesuffix("://"): RedisStore.from_url for scheme in REDIS_SCHEMES},
}


def scheme_of(location: object) -> str | None:
    """The ``SCHEMES`` entry ``location`` starts with, or None (a folder)."""
    if not isinstance(location, str) or "://" not in location:
        return None
    scheme = location.split("://", 1)[0]
    return scheme if scheme in SCHEMES else None


def is_shared_location(location: object) -> bool:
    """Whether ``location`` names a tier other processes share (a server, not a folder)."""
    return scheme_of(location) is not None


def open_tier(
    location: str | os.PathLike, fingerprint: str, codec: str = "plain", max_bytes: int | None = None
) -> KVTier:
    """The tier at ``location``: a URL with a scheme of ``SCHEMES``, or a folder (created on the
    first write). ValueError for a URL whose scheme no tier knows (rather than a folder named
    ``s3:``).

    ``max_bytes``: a byte budget for a folder (``DiskStore``; None: unbounded). For a server URL
    it is a ValueError: a shared server bounds itself (Redis: ``maxmemory <bytes>`` with
    ``maxmemory-policy allkeys-lfu``). A client-side budget was not built: with many writers none
    of them sees the server's total or the other clients' lookups, so each would evict by a
    partial view while the server already evicts by the real one."""
    scheme = scheme_of(location)
    if scheme is not None:
        if max_bytes is not None:
            raise ValueError(
                f"max_bytes is for a folder; the server at {scheme}:// bounds itself: run it with "
                "maxmemory <bytes> and maxmemory-policy allkeys-lfu"
            )
        return SCHEMES[scheme](str(location), fingerprint, codec)
    if isinstance(location, str) and "://" in location:
        known = ", ".join(f"{s}://" for s in SCHEMES)
        raise ValueError(f"no store tier serves {location.split('://', 1)[0]}:// (known: {known}, or a folder)")
    return DiskStore.open(location, fingerprint, codec, max_bytes)
