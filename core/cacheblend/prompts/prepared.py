"""A request as the engine runs it: validated, as one prompt string with its chunk spans, and
tokenized, once (``BlendEngine.request``). Prefill, streaming and the server take it as it is,
so nothing is searched for chunks, tokenized or length-checked twice."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .finder import ChunkFinder
from .request import PromptText, check_request, clean_chunk, prompt_from_text, request_prompt
from .tokenize import Encoding, encode_prompt


class ContextLengthError(ValueError):
    """The prompt does not fit the model's context window (room is left for one new token)."""

    def __init__(self, tokens: int, window: int) -> None:
        super().__init__(f"the prompt has {tokens} tokens; the model's context window is {window}")
        self.tokens, self.window = tokens, window


@dataclass(frozen=True)
class Request:
    """The prompt text with the spans of its chunks, and its token ids; it fits the window."""

    text: PromptText
    encoding: Encoding

    @property
    def ids(self) -> list[int]:
        return self.encoding.ids

    @property
    def head_tokens(self) -> int:
        """Its leading tokens that end before its first chunk starts (0 without chunks): the template,
        system message and instructions, the same across requests of one application (what
        ``blending/head.py`` computes once)."""
        if not self.text.chunks:
            return 0
        start, count = self.text.chunks[0].start, 0
        for _, end in self.encoding.offsets:
            if end > start:
                break
            count += 1
        return count

    @classmethod
    def fitted(cls, text: PromptText, encoding: Encoding, window: int) -> Request:
        """The request, or ContextLengthError when its ids leave no room for a new token."""
        if len(encoding.ids) >= window:
            raise ContextLengthError(len(encoding.ids), window)
        return cls(text, encoding)


@dataclass
class RequestBuilder:
    """Builds Requests for one tokenizer, the chunk finder of one engine and its context window
    (``lock`` guards the finder, which warming extends from other threads)."""

    tokenizer: Any
    finder: ChunkFinder
    window: int
    lock: threading.RLock

    def build(self, prompt: str | Request | None, chunks: Sequence[str] | None, query: str | None,
              prefix: str | None) -> Request:
        """A raw ``prompt`` searched for warmed chunks, or explicit ``chunks`` wrapped by the chat
        template around ``prefix``/``query``; a Request passes through (alone)."""
        if isinstance(prompt, Request):
            if chunks is not None or query is not None or prefix is not None:
                raise ValueError("a Request already holds its chunks and query: pass it alone")
            return prompt
        check_request(prompt, chunks, query, prefix)
        if prompt is not None:
            with self.lock:
                text = prompt_from_text(prompt, self.finder)
        else:
            text = request_prompt(self.tokenizer, [clean_chunk(c) for c in chunks], query, prefix)
        return Request.fitted(text, encode_prompt(self.tokenizer, text.text), self.window)
