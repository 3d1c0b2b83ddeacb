"""A disk store's catalogue: ``catalogue.jsonl``, one (key, text) line per record written.

It lets a new process find a folder's chunk texts in prompts without opening every record.
Writers append whole lines under an exclusive ``flock`` (a writer killed mid-line leaves a torn
last line, which readers skip and the next writer ends). The catalogue is a hint, never the
truth: ``DiskStore.texts`` also names every record file it lacks, read from the record's own
header, and appends those lines again, so no stored record is ever hidden by it.

A bounded store evicts records but the catalogue only grows, so ``compact`` rewrites it with one
line per record still present, once it holds more than ``2 * records + SLACK`` lines. The rewrite
is a rename (readers see the old catalogue or the new one); a line another process appends to
the old file during it is lost from the catalogue, not from the store (its record is found by
its header, as above).
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from ..files import write_atomic

SLACK = 16  # lines allowed beyond twice the records present before a compaction


class Catalogue:
    """The ``catalogue.jsonl`` at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> list[tuple[str, str]]:
        """(key, text) of every whole line, in order (a key written twice is there twice)."""
        entries: list[tuple[str, str]] = []
        if not self.path.is_file():
            return entries
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                    entries.append((str(entry.get("key", "")), entry["text"]))
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue  # a torn last line from a crashed writer
        return entries

    def append(self, entries: list[tuple[str, str]]) -> None:
        lines = _lines(entries)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # whole lines per writer, even across processes
            size = os.fstat(fd).st_size
            torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"  # a killed writer's last line
            os.write(fd, (("\n" if torn else "") + lines).encode("utf-8"))
        finally:
            os.close(fd)  # closing releases the lock

    def lines(self) -> int:
        if not self.path.is_file():
            return 0
        with open(self.path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))

    def compact(self, present: set[str]) -> bool:
        """Rewrites the catalogue with one line per key in ``present`` (the record files there
        now) once it holds more than ``2 * len(present) + SLACK`` lines; True if it did."""
        if self.lines() <= 2 * len(present) + SLACK:
            return False
        kept = {k: t for k, t in self.read() if k in present}
        write_atomic(self.path, _lines(kept.items()).encode("utf-8"), prefix=".catalogue-")
        return True


def _lines(entries) -> str:
    """One JSON line per (key, text)."""
    return "".join(json.dumps({"key": k, "text": t}, ensure_ascii=False) + "\n" for k, t in entries)
