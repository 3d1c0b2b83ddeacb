"""The disk store tier: one checksummed record file per chunk, scoped to one model fingerprint.

Disk format: one ``integrity`` record (a safetensors file: mmap-safe, no pickle, header with
fingerprint, layout, key, text, codec and an xxh3-128 checksum of the tensor bytes) per chunk
under ``<root>/<fingerprint[:16]>/kv/<key[:2]>/<key>.safetensors``, written atomically (a temp
file in ``tmp/``, fsync, rename), and an append-only ``catalogue.jsonl`` of (key, text) that
lets a new process find chunks in prompts.

What can go wrong, and what happens:
- a torn, altered or foreign record: a miss with a ``StoreWarning``; the file moves to
  ``quarantine/`` so ``warm`` (which only reads headers to see what is stored) writes it again;
- a writer killed mid-write: its temp file is removed by the next ``DiskStore`` opened on this
  host once its pid is gone (from any host after an hour);
- a writer killed between a record's rename and its catalogue line, or a lost catalogue: the
  texts of records the catalogue lacks are read from their headers and appended again;
- a read-only or full directory: a warning, and the chunks stay in memory only.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..files import write_atomic
from . import compact, integrity
from .record import ChunkRecord, StoreWarning


class DiskStore:
    """safetensors files on disk, one per chunk, scoped to one model fingerprint.

    Each file is an ``integrity`` record (checksummed, self-describing). A record that fails its
    checks is a miss with a warning and is moved to ``quarantine/``, so the next ``warm`` rewrites
    it. ``codec``: how tensors are written (``plain`` or ``int8``, see ``stores.compact``).
    """

    shared = False  # a disk store is written when a caller names it (the KV beside one vector index)

    def __init__(self, root: str | os.PathLike, fingerprint: str, codec: str = "plain") -> None:
        if codec not in compact.CODECS:
            raise ValueError(f"codec must be one of {', '.join(compact.CODECS)}; got {codec!r}")
        self.fingerprint = fingerprint
        self.codec = codec
        self.dir = Path(root) / fingerprint[:16]
        self.location = str(self.dir.resolve())
        self._catalogue = self.dir / "catalogue.jsonl"
        self._writable = True
        if self.dir.is_dir():
            _clean_temps(self.dir / "tmp")

    @classmethod
    def open(cls, root: str | os.PathLike, fingerprint: str, codec: str = "plain") -> DiskStore:
        """The store for ``fingerprint`` under ``root``, with a ``StoreWarning`` when ``root`` holds
        only stores of other models or settings (every chunk will then be computed)."""
        store = cls(root, fingerprint, codec)
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
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                inode, data = os.fstat(f.fileno()).st_ino, f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            warnings.warn(f"unreadable KV file {path} ({exc}); recomputing", StoreWarning, 2)
            return None
        try:
            return integrity.decode(data, self.fingerprint, key)
        except integrity.RecordError as exc:
            what = "was written for another model or layout" if exc.foreign else "is unreadable"
            warnings.warn(f"KV file {path} {what} ({exc}); recomputing", StoreWarning, 2)
            self._quarantine(path, inode)
            return None

    def put(self, record: ChunkRecord) -> None:
        if not self._writable:
            return
        try:
            data = integrity.encode(record, self.fingerprint, self.codec)
            write_atomic(self.path(record.key), data, tmp_dir=self.dir / "tmp", prefix=_temp_prefix())
            self._append_catalogue([(record.key, record.text)])
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
        known, texts = self._read_catalogue()
        lost: list[tuple[str, str]] = []
        for key in self._record_keys() - known:
            try:
                lost.append((key, integrity.probe(self.path(key), self.fingerprint, key)["text"]))
            except (OSError, integrity.RecordError):
                continue  # not a whole record of ours: its chunk is computed when used
        texts.update(dict.fromkeys(t for _, t in lost))
        if lost and self._writable:
            try:
                self._append_catalogue(lost)
            except OSError:
                pass  # read-only: the texts were still found for this process
        return list(texts)

    def _read_catalogue(self) -> tuple[set[str], dict[str, None]]:
        keys: set[str] = set()
        texts: dict[str, None] = {}
        if not self._catalogue.is_file():
            return keys, texts
        with open(self._catalogue, encoding="utf-8") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                    texts[entry["text"]] = None
                    keys.add(entry.get("key", ""))
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue  # a torn last line from a crashed writer
        return keys, texts

    def _record_keys(self) -> set[str]:
        kv = self.dir / "kv"
        if not kv.is_dir():
            return set()
        return {p.name.removesuffix(".safetensors") for d in kv.iterdir() for p in d.glob("*.safetensors")}

    def _append_catalogue(self, entries: list[tuple[str, str]]) -> None:
        lines = "".join(json.dumps({"key": k, "text": t}, ensure_ascii=False) + "\n" for k, t in entries)
        fd = os.open(self._catalogue, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # whole lines per writer, even across processes
            size = os.fstat(fd).st_size
            torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"  # a killed writer's last line
            os.write(fd, (("\n" if torn else "") + lines).encode("utf-8"))
        finally:
            os.close(fd)  # closing releases the lock

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
