"""How an integration warms the texts an index adds: the short-text rule and the over-long policy.

An index adds whatever its splitter produced, and one bad chunk must not lose the whole batch
(``BlendEngine.warm`` validates every text first and refuses a batch with one it cannot take).
So both integrations warm through ``warm_fitting``:

- Blank and short texts (under ``MIN_CHARS`` characters) are skipped silently. They are a few
  tokens (nothing to save), and the engine finds warmed texts wherever they stand in a prompt as
  whole words: a warmed "bar" would be cut out of every later prompt saying "the bar is open",
  changing that prompt's tokenization (" bar" is one token in running text, "bar" after a
  separate " " is two). The engine's ``ChunkFinder`` ignores such texts for the same reason.
- A text longer than a chunk may be (``BlendEngine.max_chunk_tokens``) is skipped with a
  ``ChunkTooLongWarning``: a prompt could never hold it whole, and a partial copy is never reused.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..prompts.finder import MIN_CHARS

if TYPE_CHECKING:
    from ..engine import BlendEngine
    from ..stores import ChunkKey

__all__ = ["MIN_CHARS", "ChunkTooLongWarning", "warm_fitting", "warmable"]


class ChunkTooLongWarning(UserWarning):
    """A text longer than the model's context window allows for a chunk was not warmed."""


def warmable(texts: Iterable[str]) -> list[str]:
    """The texts worth warming: strings of at least ``MIN_CHARS`` characters after stripping."""
    return [t for t in texts if isinstance(t, str) and len(t.strip()) >= MIN_CHARS]


def warm_fitting(
    engine: BlendEngine,
    texts: Iterable[str],
    *,
    store_dir: str | Path | None = None,
    batch_size: int = 8,
    progress: bool | None = None,
    neighbours: Callable[[list[str]], Sequence[Sequence[str] | None]] | None = None,
) -> list[ChunkKey]:
    """Warms the warmable ``texts`` that fit; returns the keys of those warmed, in order.

    Idempotent: stored texts cost nothing. ``store_dir`` also writes the KV to a disk store there.
    ``neighbours`` (engines with ``BlendConfig.neighbours`` > 0): called with the texts about to be
    warmed, returns the passages each is computed behind (None: the engine picks), e.g. from the
    caller's vector index.
    """
    room = engine.max_chunk_tokens
    todo = []
    for text in warmable(texts):
        n = engine.count_tokens(text.strip())
        if n <= room:
            todo.append(text)
            continue
        warnings.warn(
            f"not warming a chunk of {n} tokens: it exceeds the context window ({room} tokens for a chunk): "
            f"{text.strip()[:60]!r}...",
            ChunkTooLongWarning,
            stacklevel=2,
        )
    if not todo:
        return []
    near = neighbours(todo) if neighbours is not None and engine.neighbours else None
    return engine.warm(todo, store_dir=store_dir, batch_size=batch_size, progress=progress, neighbours=near)
