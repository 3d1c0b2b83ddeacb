"""The self-describing record bytes every persistent tier stores (disk files, Redis values).

A record is a safetensors blob whose header metadata names the model fingerprint, the layout
version, the chunk key, the chunk text, the codec of the tensors and an xxh3-128 checksum of the
whole record but that checksum: the header (every tensor's dtype, shape and offsets, every
metadata field) and the tensor bytes (the data section after it). A reader trusts none of it: the
fingerprint, layout and key must be the ones it asked for, the blob must be exactly as long as its
header says, and the checksum must match. Anything else is a ``RecordError``, which every tier
turns into a miss with a ``StoreWarning`` (never an exception in a query, never a wrong reuse).

Why the header too: a checksum of the tensor bytes alone let a rewritten header through with the
same bytes read as another dtype or shape (``F16`` as ``I16``, tokens and head_dim swapped) or
another chunk's text (found by tests/core/test_properties.py). Records checksummed the older way
(``xxh3_128:``, tensor bytes only) are refused as written by an older version and recomputed.
xxh3-128 costs about 0.04 ms per MB on these machines (``benchmarks/store_bench.py --hash``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import xxhash

from . import compact
from .record import LAYOUT_VERSION, ChunkRecord

CHECKSUM = "xxh3_128h"  # xxh3-128 of header (less the checksum) and data; "xxh3_128": data only (older)
_MAX_HEADER = 100 << 20  # a header longer than this is garbage, not a record


class RecordError(ValueError):
    """A record that must not be used. ``foreign``: written for another model, layout or key."""

    def __init__(self, reason: str, foreign: bool = False) -> None:
        super().__init__(reason)
        self.foreign = foreign


def checksum(header: dict, data: bytes | memoryview) -> str:
    """``xxh3_128h:<hex>`` of a parsed safetensors ``header`` (its metadata's checksum left out,
    written canonically: sorted keys, no spaces) followed by the data section ``data``."""
    fields = dict(header, __metadata__={k: v for k, v in header["__metadata__"].items() if k != "checksum"})
    h = xxhash.xxh3_128(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode())
    h.update(data)
    return f"{CHECKSUM}:{h.hexdigest()}"


def encode(record: ChunkRecord, fingerprint: str, codec: str = "plain") -> bytes:
    """The record's bytes: tensors packed by ``codec`` (see ``compact``), header with checksum."""
    from safetensors.torch import save

    tensors, meta = compact.pack(record.kv, codec)
    meta.update(fingerprint=fingerprint, layout=str(LAYOUT_VERSION), key=record.key, text=record.text)
    body = save(tensors, metadata=meta)  # serialized once without the checksum, to hash it
    start = _data_start(body)
    meta["checksum"] = checksum(json.loads(body[8:start]), memoryview(body)[start:])
    return save(tensors, metadata=meta)


def decode(data: bytes, fingerprint: str, key: str) -> ChunkRecord:
    """The record in ``data`` if it is whole, unaltered and the one asked for; else RecordError."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    header, start, end = _parse(data, fingerprint, key)
    if len(data) != end:
        raise RecordError(f"{len(data)} bytes where the header promises {end} (truncated or padded)")
    meta = header["__metadata__"]
    if checksum(header, memoryview(data)[start:]) != meta["checksum"]:
        raise RecordError("checksum mismatch: the header or the tensor bytes were altered")
    try:
        kv = compact.unpack(load(bytes(data)), meta)
    except (ValueError, KeyError, RuntimeError, SafetensorError) as exc:
        raise RecordError(f"undecodable tensors ({exc})") from exc
    return ChunkRecord(key=key, kv=kv, text=meta["text"])


def parse_header(data: bytes, fingerprint: str, key: str) -> tuple[dict[str, str], int, int]:
    """(metadata, data-section start, expected total length); RecordError if it is not our record."""
    header, start, end = _parse(data, fingerprint, key)
    return header["__metadata__"], start, end


def header_span(head: bytes) -> int:
    """How many leading bytes of a record that starts with ``head`` (8 bytes at least) hold its
    header: what a reader of the header alone fetches (a Redis ``GETRANGE``). Capped, so garbage
    asks for no more than a header may be; 0 if ``head`` is too short to tell."""
    return 8 + min(int.from_bytes(head[:8], "little"), _MAX_HEADER) if len(head) >= 8 else 0


def _parse(data: bytes, fingerprint: str, key: str) -> tuple[dict, int, int]:
    """(the whole parsed header, data-section start, expected total length), or RecordError."""
    if len(data) < 8:
        raise RecordError(f"{len(data)} bytes: no header")
    n = int.from_bytes(data[:8], "little")
    if n > _MAX_HEADER or 8 + n > len(data):
        raise RecordError(f"header of {n} bytes does not fit in {len(data)} bytes")
    try:
        header = json.loads(bytes(data[8 : 8 + n]))
        meta = header["__metadata__"]
        tensors = [t for name, t in header.items() if name != "__metadata__"]
        end = 8 + n + max((t["data_offsets"][1] for t in tensors), default=0)
        if not isinstance(end, int) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            raise TypeError("data offsets must be integers and metadata strings")
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise RecordError(f"unparsable header ({exc!r})") from exc
    if meta.get("fingerprint") != fingerprint or meta.get("layout") != str(LAYOUT_VERSION):
        raise RecordError("written for another model or layout", foreign=True)
    if meta.get("key") != key:
        raise RecordError(f"holds key {str(meta.get('key'))[:16]}..., not the key asked for", foreign=True)
    if not meta.get("checksum", "").startswith(f"{CHECKSUM}:") or "text" not in meta:
        raise RecordError("no checksum of this version or no text in the header (written by an older version)")
    return header, 8 + n, end


def probe(path: Path, fingerprint: str, key: str) -> dict[str, str]:
    """The header of the record file at ``path`` if it is ours and as long as it says (reads only
    the header: what ``warm`` uses to decide a record is present). OSError if it cannot be read."""
    with open(path, "rb") as f:
        blob = f.read(8)
        n = int.from_bytes(blob, "little") if len(blob) == 8 else 0
        blob += f.read(min(n, _MAX_HEADER))
        size = os.fstat(f.fileno()).st_size
    meta, _, end = parse_header(blob, fingerprint, key)
    if size != end:
        raise RecordError(f"{size} bytes where the header promises {end} (truncated or padded)")
    return meta


def _data_start(blob: bytes) -> int:
    return 8 + int.from_bytes(blob[:8], "little")
