"""Token usage of a generation, mapped once from BlendStats to what frameworks and clients read.

``cached_tokens`` counts prompt tokens whose KV came from the cache and was not recomputed
(``BlendStats.reused_tokens``; ``BlendStats.hit_tokens`` also counts the recomputed ones): what
OpenAI calls ``prompt_tokens_details.cached_tokens`` and LangChain ``input_token_details.cache_read``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..result import BlendStats


@dataclass(frozen=True)
class Usage:
    """Prompt, completion and cached token counts of one generation (or a sum of several)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @classmethod
    def of(cls, stats: BlendStats) -> Usage:
        return cls(stats.prompt_tokens, stats.completion_tokens, stats.reused_tokens)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cached_tokens + other.cached_tokens,
        )

    def openai(self) -> dict[str, Any]:
        """OpenAI's ``usage`` object (also what LlamaIndex's token counting reads)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }
