"""Where chunk KV is kept: the record and its keys, and the store tiers.

``record.py`` (ChunkRecord, LAYOUT_VERSION) and ``keys.py`` (fingerprints, content-addressed
chunk keys) are what every tier agrees on; ``integrity.py`` is the checksummed record bytes that
the persistent tiers hold and ``compact.py`` their int8/int4 codecs. ``tier.py`` says what a tier
is (``KVTier``: get_many / put_many / contains_many / texts, ``shared``, ``location``) and maps
a location to one (``open_tier``: a URL scheme or a folder); ``memory.py``, ``disk.py`` and
``redis.py`` are the tiers and ``chain.py`` reads them in order. ``policy.py`` is what a bounded
tier keeps (recency and popularity: aged lookup counts, TinyLFU-style admission): the memory tier
and a disk tier with ``max_bytes`` use it; a Redis server bounds itself (``maxmemory`` with
``maxmemory-policy allkeys-lfu``). A new tier is one module here plus its line in
``tier.SCHEMES``; every failure inside a tier is a miss with a ``StoreWarning``.
"""

from .chain import StoreChain
from .disk import DiskStore
from .keys import LEAD, ChunkKey, Fingerprint, RecordKeys, chunk_key, model_fingerprint
from .memory import MemoryStore
from .policy import Policy
from .record import LAYOUT_VERSION, ChunkRecord, StoreWarning
from .redis import RedisStore
from .tier import KVTier, is_shared_location, open_tier

__all__ = [
    "LAYOUT_VERSION",
    "LEAD",
    "ChunkKey",
    "ChunkRecord",
    "DiskStore",
    "Fingerprint",
    "KVTier",
    "MemoryStore",
    "Policy",
    "RecordKeys",
    "RedisStore",
    "StoreChain",
    "StoreWarning",
    "chunk_key",
    "is_shared_location",
    "model_fingerprint",
    "open_tier",
]
