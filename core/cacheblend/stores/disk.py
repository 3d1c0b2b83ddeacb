"""The disk store tier: one checksummed record file per chunk, scoped to one model fingerprint.

Disk format: one ``integrity`` record (a safetensors file: mmap-safe, no pickle, header with
fingerprint, layout, key, text, codec and an xxh3-128 checksum of the tensor bytes) per chunk
under ``<root>/<fingerprint[:16]>/kv/<key[:2]>/<key>.safetensors``, written atomically (a temp
file in ``tmp/``, fsync, rename), and a ``catalogue.jsonl`` of (key, text) that lets a new
process find chunks in prompts (``stores.catalogue``: appended per record, compacted by a bounded
store once evictions have left it more than twice the records present).

What can go wrong, and what happens:
- a torn, altered or foreign record: a miss with a ``StoreWarning``; the file moves to
  ``quarantine/`` so ``warm`` (which only reads headers to see what is stored) writes it again;
- a writer killed mid-write: its temp file is removed by the next ``DiskStore`` opened on this
  host once its pid is gone (from any host after an hour);
- a writer killed between a record's rename and its catalogue line, or a lost catalogue: the
  texts of records the catalogue lacks are read from their headers and appended again;
- a read-only or full directory: a warning, and the chunks stay in memory only.

A byte budget (``max_bytes``; None: unbounded) keeps the record files' total at or under it by
``stores.policy`` (this process's lookups, hits and misses, counted; least looked-up, then least
recent, deleted first; a new record written only if looked up as often as what it pushes out).
At open the files seed it (size; mtime as last use: oldest-touched go first). Deleting is an atomic
``unlink``: a reader sees a whole record or a miss (one that opened the file reads on). A catalogued
text whose record is gone is a miss (until a compaction drops its line); ``texts()`` still names
every record present. Processes sharing
a folder each enforce the budget over what they listed last plus their own writes and deletes, and
list again at open and after writing ``max_bytes / RESCAN_FRACTION``: with ``w`` writers the total
may pass the budget by about ``w * max_bytes / 8`` between listings. Popularity is per process.
"""

from __future__ import annotations

import os
import socket
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..files import write_atomic
from . import compact, integrity
from .catalogue import Catalogue
from .policy import Policy
from .record import ChunkRecord, StoreWarning

RESCAN_FRACTION = 8  # list the folder again after writing max_bytes / RESCAN_FRACTION


class DiskStore:
    """safetensors files on disk, one per chunk, scoped to one model fingerprint.

    Each file is an ``integrity`` record (checksummed, self-describing). A record that fails its
    checks is a miss with a warning and is moved to ``quarantine/``, so the next ``warm`` rewrites
    it. ``codec``: how tensors are written (``plain`` or ``int8``, see ``stores.compact``).
    ``max_bytes``: a budget for the record files (None: unbounded; see the module docstring).
    Counters: ``hits``, ``misses``, ``evictions`` (files deleted for the budget), ``rejected``
    (writes refused by admission or larger than the budget).
    """

    shared = False  # a disk store is written when a caller names it (the KV beside one vector index)

    def __init__(
        self, root: str | os.PathLike, fingerprint: str, codec: str = "plain", max_bytes: int | None = None
    ) -> None:
        if codec not in compact.CODECS:
            raise ValueError(f"codec must be one of {', '.join(compact.CODECS)}; got {codec!r}")
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive or None, got {max_bytes}")
        self.fingerprint, self.codec = fingerprint, codec
        self.dir = Path(root) / fingerprint[:16]
        self.location = str(self.dir.resolve())
        self.catalogue = Catalogue(self.dir / "catalogue.jsonl")
        self._writable = True
        self.max_bytes = max_bytes
        self.policy = Policy(max_bytes, clock=time.time) if max_bytes is not None else None
        self.hits = self.misses = self.evictions = self.rejected = 0
        self._written = 0  # bytes this process wrote since its last scan
        if self.dir.is_dir():
            _clean_temps(self.dir / "tmp")
            self.rescan()

    @classmethod
    def open(
        cls, root: str | os.PathLike, fingerprint: str, codec: str = "plain", max_bytes: int | None = None
    ) -> DiskStore:
        """The store for ``fingerprint`` under ``root``, with a ``StoreWarning`` when ``root`` holds
        only stores of other models or settings (every chunk will then be computed)."""
        store = cls(root, fingerprint, codec, max_bytes)
        others = [fp for fp in cls.fingerprints(root) if not fingerprint.startswith(fp)]
        if others and not store.dir.is_dir():
            warnings.warn(
                f"the KV store at {root} holds only KV written for other models or settings "
                f"({', '.join(others)}); every chunk will be computed",
                StoreWarning,
                stacklevel=4,  # DiskStore.open <- open_tier <- BlendEngine.attach_store <- its caller
            )
        return store

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
        """Whether a whole record of ours is there (its header is read, not its tensors)."""
        try:
            integrity.probe(self.path(key), self.fingerprint, key)
            return True
        except (OSError, integrity.RecordError):
            return False

    def get(self, key: str) -> ChunkRecord | None:
        record, size = self._read(key)
        self.hits, self.misses = self.hits + (record is not None), self.misses + (record is None)
        if self.policy is not None:
            self.policy.touch(key)
            if record is None:
                self.policy.remove(key)  # gone (deleted by another process) or quarantined
            elif key not in self.policy:
                self.policy.add(key, size)  # written by another process since the last scan
        return record

    def _read(self, key: str) -> tuple[ChunkRecord | None, int]:
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                inode, data = os.fstat(f.fileno()).st_ino, f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None, 0
        except OSError as exc:
            warnings.warn(f"unreadable KV file {path} ({exc}); recomputing", StoreWarning, 3)
            return None, 0
        try:
            return integrity.decode(data, self.fingerprint, key), len(data)
        except integrity.RecordError as exc:
            what = "was written for another model or layout" if exc.foreign else "is unreadable"
            warnings.warn(f"KV file {path} {what} ({exc}); recomputing", StoreWarning, 3)
            self._quarantine(path, inode)
            return None, 0

    def put(self, record: ChunkRecord) -> None:
        if not self._writable:
            return
        try:
            data = integrity.encode(record, self.fingerprint, self.codec)
            if self.policy is not None and not self._make_room(record.key, len(data)):
                return
            write_atomic(self.path(record.key), data, tmp_dir=self.dir / "tmp", prefix=_temp_prefix())
            self.catalogue.append([(record.key, record.text)])
            if self.policy is not None:
                self.policy.add(record.key, len(data))
                self._written += len(data)
                if self._written * RESCAN_FRACTION > self.max_bytes:
                    self.rescan()
        except OSError as exc:
            self._writable = False
            warnings.warn(
                f"cannot write the KV store at {self.dir} ({exc}); chunks stay in memory only", StoreWarning, 2
            )

    def get_many(self, keys: Sequence[str]) -> list[ChunkRecord | None]:
        return [self.get(k) for k in keys]

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        return [k in self for k in keys]

    def put_many(self, records: Sequence[ChunkRecord]) -> None:
        for record in records:
            self.put(record)

    def texts(self) -> Iterable[str]:
        """The catalogue's texts, plus (re-catalogued) those of any record the catalogue lacks."""
        entries = self.catalogue.read()
        texts = dict.fromkeys(t for _, t in entries)
        lost: list[tuple[str, str]] = []
        for key in self._record_files().keys() - {k for k, _ in entries}:
            try:
                lost.append((key, integrity.probe(self.path(key), self.fingerprint, key)["text"]))
            except (OSError, integrity.RecordError):
                continue  # not a whole record of ours: its chunk is computed when used
        texts.update(dict.fromkeys(t for _, t in lost))
        if lost and self._writable:
            try:
                self.catalogue.append(lost)
            except OSError:
                pass  # read-only: the texts were still found for this process
        return list(texts)

    def rescan(self) -> None:
        """Lists the record files (others' too) into the policy; deletes what is over budget."""
        if self.policy is not None:
            self._written = 0
            self.policy.sync(self._record_files())
            self._evict(self.policy.over_budget())
            try:
                self.catalogue.compact(self._record_keys())
            except OSError:
                pass  # read-only: the catalogue stays as it is

    def _make_room(self, key: str, nbytes: int) -> bool:
        """Deletes the files the policy picks so ``key`` fits; False when admission refuses it."""
        victims = self.policy.plan(key, nbytes)
        if victims is None:
            self.rejected += 1
            return False
        self._evict(victims)
        return True

    def _evict(self, keys: list[str]) -> None:
        for key in keys:
            self.policy.remove(key)
            try:
                self.path(key).unlink()
                self.evictions += 1
            except FileNotFoundError:
                continue  # another process deleted it first
            except OSError:
                return  # read-only: nothing can be deleted (nor written)

    def _record_files(self) -> dict[str, tuple[int, float]]:
        """key -> (size, mtime) of every record file there now."""
        found: dict[str, tuple[int, float]] = {}
        for path in (self.dir / "kv").glob("*/*.safetensors"):
            try:
                st = path.stat()
            except OSError:
                continue  # deleted while listed
            found[path.name.removesuffix(".safetensors")] = (st.st_size, st.st_mtime)
        return found

    def _record_keys(self) -> set[str]:
        return set(self._record_files())

    def _quarantine(self, path: Path, inode: int) -> None:
        """Moves a bad record aside (unless a writer has just replaced it with a new file)."""
        try:
            if os.stat(path).st_ino == inode:
                (self.dir / "quarantine").mkdir(exist_ok=True)
                os.replace(path, self.dir / "quarantine" / path.name)
        except OSError:
            pass  # read-only or already gone: it stays a miss


_TEMP_MAX_AGE_S = 3600


def _temp_prefix() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-"


def _clean_temps(tmp_dir: Path) -> None:
    """Removes temp files of writers that died: on this host when their pid is gone, from any
    host (a shared volume) when older than an hour."""
    if not tmp_dir.is_dir():
        return
    host, now = socket.gethostname(), time.time()
    for p in tmp_dir.glob("*.part"):
        owner, _, rest = p.name.rpartition("-")[0].rpartition("-")
        try:
            dead = owner == host and not _alive(int(rest))
            if dead or now - p.stat().st_mtime > _TEMP_MAX_AGE_S:
                p.unlink()
        except (OSError, ValueError):
            continue


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
