"""Chunk KV stores: the record, the protocol, and the memory, disk and tiered stores.

Layout of a record's tensor (LAYOUT_VERSION 1): ``[layers, 2, kv_heads, tokens, head_dim]``,
index 0 of dim 1 is K *before RoPE*, index 1 is V, in the configured KV dtype.

Disk format: one safetensors file per chunk (mmap, no pickle) under
``<root>/<fingerprint[:16]>/kv/<key[:2]>/<key>.safetensors`` whose header metadata holds the
model fingerprint and the layout version, written atomically (temp file, fsync, rename), and an
append-only ``catalogue.jsonl`` of the warmed texts that lets a new process find chunks in
prompts. A torn, corrupt or mismatched file is a miss with a warning, never an exception and
never a wrong reuse. A read-only or full directory degrades to the memory tier with a warning.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import warnings
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

LAYOUT_VERSION = 1


class StoreWarning(UserWarning):
    """A store could not read or write a chunk; the engine recomputes instead."""


@dataclass(frozen=True)
class ChunkKV:
    """One chunk's cached KV. kv: [layers, 2, kv_heads, tokens, head_dim]; text: the chunk text."""

    key: str
    kv: torch.Tensor
    text: str

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


class KVStore(Protocol):
    """What the engine needs of a store."""

    def get(self, key: str) -> ChunkKV | None: ...

    def put(self, record: ChunkKV) -> None: ...

    def __contains__(self, key: str) -> bool: ...

    def texts(self) -> Iterable[str]:
        """Every chunk text this store has been warmed with (for finding chunks in prompts)."""
        ...


class MemoryStore:
    """In-process store with a byte budget and least-recently-used eviction.

    Texts stay known after their KV is evicted (a later use of that chunk is a miss, not an error).
    """

    def __init__(self, max_bytes: int = 2 << 30) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.max_bytes = max_bytes
        self._records: OrderedDict[str, ChunkKV] = OrderedDict()
        self._texts: dict[str, None] = {}
        self.nbytes = 0

    def get(self, key: str) -> ChunkKV | None:
        record = self._records.get(key)
        if record is not None:
            self._records.move_to_end(key)
        return record

    def put(self, record: ChunkKV) -> None:
        self._texts[record.text] = None
        if record.nbytes > self.max_bytes:
            return  # larger than the whole budget: not kept
        old = self._records.pop(record.key, None)
        self.nbytes -= old.nbytes if old is not None else 0
        self._records[record.key] = record
        self.nbytes += record.nbytes
        while self.nbytes > self.max_bytes:
            _, evicted = self._records.popitem(last=False)
            self.nbytes -= evicted.nbytes

    def __contains__(self, key: str) -> bool:
        return key in self._records

    def __len__(self) -> int:
        return len(self._records)

    def texts(self) -> Iterable[str]:
        return list(self._texts)


class DiskStore:
    """safetensors files on disk, one per chunk, scoped to one model fingerprint."""

    def __init__(self, root: str | os.PathLike, fingerprint: str) -> None:
        self.fingerprint = fingerprint
        self.dir = Path(root) / fingerprint[:16]
        self._catalogue = self.dir / "catalogue.jsonl"
        self._writable = True

    @staticmethod
    def fingerprints(root: str | os.PathLike) -> list[str]:
        """The (16-character) fingerprint prefixes that have a store under ``root``."""
        base = Path(root)
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if p.is_dir() and len(p.name) == 16)

    def path(self, key: str) -> Path:
        return self.dir / "kv" / key[:2] / f"{key}.safetensors"

    def __contains__(self, key: str) -> bool:
        return self.path(key).is_file()

    def get(self, key: str) -> ChunkKV | None:
        path = self.path(key)
        if not path.is_file():
            return None
        try:
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                if meta.get("fingerprint") != self.fingerprint or meta.get("layout") != str(LAYOUT_VERSION):
                    warnings.warn(f"{path} was written for another model or layout; recomputing", StoreWarning, 2)
                    return None
                if meta.get("key") != key:
                    raise ValueError("key in header does not match the file name")
                return ChunkKV(key=key, kv=f.get_tensor("kv"), text=meta.get("text", ""))
        except Exception as exc:  # a torn or corrupt file must never crash a query
            warnings.warn(f"unreadable KV file {path} ({exc}); recomputing", StoreWarning, 2)
            return None

    def put(self, record: ChunkKV) -> None:
        if not self._writable:
            return
        path = self.path(record.key)
        meta = {
            "fingerprint": self.fingerprint,
            "layout": str(LAYOUT_VERSION),
            "key": record.key,
            "text": record.text,
        }
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _atomic_save(path, record.kv, meta)
            self._append_catalogue(record.text)
        except OSError as exc:
            self._writable = False
            warnings.warn(
                f"cannot write the KV store at {self.dir} ({exc}); chunks stay in memory only", StoreWarning, 2
            )

    def texts(self) -> Iterable[str]:
        if not self._catalogue.is_file():
            return []
        out: dict[str, None] = {}
        with open(self._catalogue, encoding="utf-8") as f:
            for line in f:
                try:
                    out[json.loads(line)["text"]] = None
                except (ValueError, KeyError, TypeError):
                    continue  # a torn last line from a crashed writer
        return list(out)

    def _append_catalogue(self, text: str) -> None:
        line = (json.dumps({"text": text}, ensure_ascii=False) + "\n").encode("utf-8")
        fd = os.open(self._catalogue, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # one whole line per writer, even across processes
            os.write(fd, line)
        finally:
            os.close(fd)  # closing releases the lock


def _atomic_save(path: Path, kv: torch.Tensor, meta: dict[str, str]) -> None:
    """Writes ``path`` so that readers see either nothing or the whole file."""
    from safetensors.torch import save

    data = save({"kv": kv.detach().contiguous().cpu()}, metadata=meta)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".safetensors")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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

    def get(self, key: str) -> ChunkKV | None:
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

    def texts(self) -> Iterable[str]:
        found: dict[str, None] = dict.fromkeys(self.memory.texts())
        for disk in self.disks:
            found.update(dict.fromkeys(disk.texts()))
        return list(found)
