"""Where chunk KV is kept: the record and its keys, and the store tiers.

``record.py`` (ChunkRecord, LAYOUT_VERSION) and ``keys.py`` (fingerprints, content-addressed
chunk keys) are what every tier agrees on; ``memory.py``, ``disk.py`` are the tiers and
``chain.py`` reads them in order. A new tier (a remote store, say) is one module here with
``get(key) -> ChunkRecord | None``, ``put(record)`` and ``__contains__``, where every failure
is a miss with a ``StoreWarning``.
"""

from .chain import StoreChain
from .disk import DiskStore
from .keys import ChunkKey, Fingerprint, chunk_key, model_fingerprint
from .memory import MemoryStore
from .record import LAYOUT_VERSION, ChunkRecord, StoreWarning

__all__ = [
    "LAYOUT_VERSION",
    "ChunkKey",
    "ChunkRecord",
    "DiskStore",
    "Fingerprint",
    "MemoryStore",
    "StoreChain",
    "StoreWarning",
    "chunk_key",
    "model_fingerprint",
]
