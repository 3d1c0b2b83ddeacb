"""A request as the engine runs it: validated, as one prompt string with its chunk spans, and
tokenized, once (``BlendEngine.request``). Prefill, streaming and the server take it as it is,
so nothing is searched for chunks, tokenized or length-checked twice."""

from __future__ import annotations

from dataclasses import dataclass

from .request import PromptText
from .tokenize import Encoding


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

    @classmethod
    def fitted(cls, text: PromptText, encoding: Encoding, window: int) -> Request:
        """The request, or ContextLengthError when its ids leave no room for a new token."""
        if len(encoding.ids) >= window:
            raise ContextLengthError(len(encoding.ids), window)
        return cls(text, encoding)
