"""The disk store tier: one safetensors file per chunk, scoped to one model fingerprint.

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
from collections.abc import Iterable
from pathlib import Path

import torch

from .record import LAYOUT_VERSION, ChunkRecord, StoreWarning


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

    def get(self, key: str) -> ChunkRecord | None:
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
                return ChunkRecord(key=key, kv=f.get_tensor("kv"), text=meta.get("text", ""))
        except Exception as exc:  # a torn or corrupt file must never crash a query
            warnings.warn(f"unreadable KV file {path} ({exc}); recomputing", StoreWarning, 2)
            return None

    def put(self, record: ChunkRecord) -> None:
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
