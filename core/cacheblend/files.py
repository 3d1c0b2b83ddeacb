"""Writing a file so that readers see the old one or the whole new one, and a crash loses neither.

The one atomic writer of the three packages and the benchmarks: a temp file on the same file
system (so the rename is atomic), fsync before the rename (so the name never points at data still
in the page cache when the machine dies), readable by other users like any file (``mkstemp``
makes 0600). It imports nothing heavy: tools that must not load torch use it too.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike, data: bytes, *, tmp_dir: str | os.PathLike | None = None, prefix: str = ".") -> Path:
    """Writes ``data`` to ``path`` atomically; returns the path. ``tmp_dir``: where the temp file
    lives (default: beside ``path``; it must be on the same file system); ``prefix``: the temp
    file's name prefix (a store names its writer there so that a crashed writer's leftovers can
    be told apart)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tmp_dir) if tmp_dir is not None else path.parent
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=".part")
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
