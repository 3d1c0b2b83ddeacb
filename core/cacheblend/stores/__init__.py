"""Where chunk KV is kept: the record and its keys, and the store tiers.

``record.py`` (ChunkRecord, LAYOUT_VERSION) and ``keys.py`` (fingerprints, content-addressed
chunk keys) are what every tier agrees on; ``integrity.py`` is the checksummed record bytes that
the persistent tiers hold and ``compact.py`` their int8 codec; ``memory.py``, ``disk.py`` and
``redis.py`` are the tiers and ``chain.py`` reads them in order. A new tier is one module here
with ``get(key) -> ChunkRecord | None``, ``put(record)`` and ``__contains__`` (``get_many`` where a
batch saves round trips), where every failure is a miss with a ``StoreWarning``.
"""

from .chain import StoreChain
from .disk import DiskStore
from .keys import LEAD, ChunkKey, Fingerprint, chunk_key, model_fingerprint
from .memory import MemoryStore
from .record import LAYOUT_VERSION, ChunkRecord, StoreWarning
from .redis import RedisStore

__all__ = [
    "LAYOUT_VERSION",
    "LEAD",
    "ChunkKey",
    "ChunkRecord",
    "DiskStore",
    "Fingerprint",
    "MemoryStore",
    "RedisStore",
    "StoreChain",
    "StoreWarning",
    "chunk_key",
    "model_fingerprint",
]
