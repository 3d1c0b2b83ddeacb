"""Keeping chunk KV beside a persisted vector index, and reading it back.

Every index directory keeps its KV store in one sub-folder, ``<index dir>/cacheblend/`` (per-model
fingerprint folders of safetensors files and a text catalogue, see ``cacheblend.stores.disk``).
A small JSON file written atomically next to it can say which model the KV belongs to.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..files import write_atomic
from .warming import warmable

if TYPE_CHECKING:
    from ..engine import BlendEngine

KV_DIR = "cacheblend"


def kv_store_dir(index_dir: str | os.PathLike) -> Path:
    """Where an index persisted at ``index_dir`` keeps its chunk KV: ``<index_dir>/cacheblend``."""
    return Path(index_dir) / KV_DIR


def unstored_texts(engine: BlendEngine, kv_dir: str | os.PathLike, texts: Iterable[str]) -> list[str]:
    """Attaches the KV store at ``kv_dir`` to ``engine``; returns the warmable ``texts`` it lacks.

    Which texts are stored is read from the store's catalogue: no KV is loaded and nothing is
    tokenized for the texts present.
    """
    stored = set(engine.attach_store(kv_dir).texts())
    return [t for t in warmable(texts) if t.strip() not in stored]


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Writes ``data`` to ``path`` atomically (temp file + rename): readers see all or nothing."""
    write_atomic(path, json.dumps(data, indent=1).encode("utf-8"), prefix=".tmp-")


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object at ``path``, or {} when it is absent or unreadable (with a warning)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        warnings.warn(f"ignoring unreadable {path} ({exc})", UserWarning, stacklevel=3)
        return {}
    return data if isinstance(data, dict) else {}
