"""Finding the texts of warmed chunks inside an arbitrary prompt string.

This is what makes the LangChain and LlamaIndex classes drop-in: a chain formats retrieved
documents into a prompt with whatever template and separators it likes, and the engine finds
the chunk texts in it, in any order. Matching is exact on the (stripped) chunk text, so a chunk
that a framework truncated or re-packed is simply not found and gets computed: never a wrong
reuse.

An index maps the first ``ANCHOR`` characters of every chunk to the chunks starting with them;
a scan looks the prompt up at every offset and verifies candidates in full. Overlapping matches
resolve left to right, longest first, and a match never cuts a word in two.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

ANCHOR = 32
MIN_CHARS = 32  # shorter texts are never searched for (see ChunkFinder)


@dataclass(frozen=True)
class Span:
    """prompt[start:end] == text, a warmed chunk."""

    start: int
    end: int
    text: str


class ChunkFinder:
    """An index of warmed chunk texts, searchable in prompts.

    Texts shorter than ``min_chars`` are not searched for: a warmed "bar" would otherwise be cut
    out of every prompt that says "the bar is open", changing how that prompt tokenizes, for a
    saving of a token or two. Their KV is still used when chunks are passed explicitly.
    """

    def __init__(self, texts: Iterable[str] = (), min_chars: int = MIN_CHARS) -> None:
        self.min_chars = min_chars
        self._by_anchor: dict[str, list[str]] = {}
        self._short_lengths: set[int] = set()
        self._known: set[str] = set()
        self.add(texts)

    def __len__(self) -> int:
        return len(self._known)

    def __contains__(self, text: str) -> bool:
        return text in self._known

    def __iter__(self):
        """The known texts (a snapshot, in no particular order)."""
        return iter(list(self._known))

    def add(self, texts: Iterable[str]) -> None:
        """Adds chunk texts (already stripped, non-empty)."""
        for text in texts:
            if len(text) < self.min_chars or text in self._known:
                continue
            self._known.add(text)
            if len(text) < ANCHOR:
                self._short_lengths.add(len(text))
            bucket = self._by_anchor.setdefault(text[:ANCHOR], [])
            bucket.append(text)
            bucket.sort(key=len, reverse=True)  # longest first

    def find(self, prompt: str) -> list[Span]:
        """Non-overlapping occurrences of known chunks in ``prompt``, in order."""
        spans: list[Span] = []
        i, n = 0, len(prompt)
        lengths = sorted(self._short_lengths | {ANCHOR}, reverse=True)
        while i < n:
            match = self._match_at(prompt, i, lengths)
            if match is None:
                i += 1
                continue
            spans.append(Span(i, i + len(match), match))
            i += len(match)
        return spans

    def _match_at(self, prompt: str, i: int, lengths: list[int]) -> str | None:
        for length in lengths:
            bucket = self._by_anchor.get(prompt[i : i + length])
            if not bucket:
                continue
            for text in bucket:  # longest first
                if prompt.startswith(text, i) and _on_boundaries(prompt, i, i + len(text)):
                    return text
        return None


def _on_boundaries(prompt: str, start: int, end: int) -> bool:
    """False when the match would cut a word (letters or digits run on across either end):
    "cat" is not found in "concatenate", so a short chunk never splits another text's words."""
    cuts_left = start > 0 and prompt[start - 1].isalnum() and prompt[start].isalnum()
    cuts_right = end < len(prompt) and prompt[end - 1].isalnum() and prompt[end].isalnum()
    return not (cuts_left or cuts_right)
