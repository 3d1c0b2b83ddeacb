"""How an integration warms the texts an index adds: the short-text rule and the over-long policy.

An index adds whatever its splitter produced, and one bad chunk must not lose the whole batch
(``BlendEngine.warm`` validates every text first and refuses a batch with one it cannot take).
So both integrations warm through ``warm_fitting``:

- Blank and short texts (under ``MIN_CHARS`` characters) are skipped silently. They are a few
  tokens (nothing to save), and the engine finds warmed texts wherever they stand in a prompt as
  whole words: a warmed "bar" would be cut out of every later prompt saying "the bar is open",
  changing that prompt's tokenization (" bar" is one token in running text, "bar" after a
  separate " " is two). The engine's ``ChunkFinder`` ignores such texts for the same reason.
- A text longer than a chunk may be (``Warmer.max_chunk_tokens``) is skipped with a
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

__all__ = ["MIN_CHARS", "ChunkTooLongWarning", "WarmCap", "warm_fitting", "warmable"]


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
    nearest: Callable[[list[str]], Sequence[Sequence[str] | None]] | None = None,
) -> list[ChunkKey]:
    """Warms the warmable ``texts`` that fit; returns the keys of those warmed, in order.

    Idempotent: stored texts cost nothing. ``store_dir`` also writes the KV to a disk store there.
    ``nearest`` (engines with ``BlendConfig.neighbours`` > 0): called with the texts about to be
    warmed, returns the passages each is computed behind (None: the engine picks), e.g. from the
    caller's vector index.
    """
    room = engine.kv.warmer.max_chunk_tokens
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
    behind = nearest(todo) if nearest is not None and engine.kv.neighbours else None
    return engine.warm(todo, store_dir=store_dir, batch_size=batch_size, progress=progress, behind=behind)


class WarmCap:
    """Index-time warming capped at the first ``limit`` texts an index adds (None: no cap), so that
    a large corpus indexes fast and the store fills from traffic: texts past the cap are only
    expected (``ChunkKV.expect``: found in prompts, computed there) and the engine's warm on
    miss is switched on, so each is warmed after the first answer that retrieves it."""

    def __init__(self, limit: int | None = None) -> None:
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise ValueError(f"warm_limit must be None or an integer >= 0, got {limit!r}")
        self.limit, self.used = limit, 0

    def split(self, engine: BlendEngine, texts: Iterable[str]) -> list[str]:
        """The texts to warm now (within the cap); expects the others on ``engine``."""
        texts = list(texts)
        if self.limit is None:
            return texts
        texts = warmable(texts)
        room = max(0, self.limit - self.used)
        now, later = texts[:room], texts[room:]
        self.used += len(now)
        if later:
            engine.kv.enable_warm_on_miss()
            engine.kv.expect(t.strip() for t in later)
        return now
