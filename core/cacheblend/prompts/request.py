"""A request as one prompt string and the places of its chunks in it.

A request is either a raw prompt (searched for the texts of warmed chunks: that is how chains that
format their own prompts get reuse) or explicit chunks with a query and an optional prefix, which
the chat template wraps the documented way: the system message is the prefix, the user message
is the chunks joined by blank lines, a blank line, then the query. Either way the result is the
whole prompt text plus the character spans of the chunks in it; ``tokenize.py`` then tokenizes
that text once, exactly as the model's tokenizer does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .finder import ChunkFinder, Span

CHUNK_SEPARATOR = "\n\n"
SENTINEL = "\x00cacheblend-{}\x00"


@dataclass(frozen=True)
class PromptText:
    """The whole prompt, and the spans (``text[start:end] == chunk``) of the chunks in it, in order."""

    text: str
    chunks: tuple[Span, ...] = ()


def clean_chunk(text: str) -> str:
    """The canonical form of a chunk text (stripped); empty or non-text input is a ValueError."""
    if not isinstance(text, str):
        raise ValueError(f"a chunk must be a string, got {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        raise ValueError("a chunk must contain non-whitespace text")
    return stripped


def check_request(prompt: Any, chunks: Sequence[str] | None, query: str | None, prefix: str | None) -> None:
    """ValueError unless the request is a non-empty ``prompt`` alone, or ``chunks`` (at least one)
    with a ``query`` (and an optional ``prefix``)."""
    if prompt is not None:
        if chunks is not None or query is not None or prefix is not None:
            raise ValueError("pass either prompt, or chunks with query (and optional prefix), not both")
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("prompt must be a non-empty string")
        return
    if chunks is None or query is None:
        raise ValueError("pass a prompt, or chunks and a query")
    if not chunks:
        raise ValueError("chunks is empty; pass at least one chunk, or use prompt= for a plain prompt")


def prompt_from_text(prompt: str, finder: ChunkFinder) -> PromptText:
    """A raw prompt, with the warmed chunk texts found in it."""
    return PromptText(prompt, tuple(finder.find(prompt)))


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_chat(tokenizer: Any, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True, **kw) -> str:
    """The chat template applied to ``messages`` (role/content dicts), as a string."""
    return tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **kw
    )


def request_prompt(tokenizer: Any, chunks: Sequence[str], query: str, prefix: str | None) -> PromptText:
    """The prompt of an explicit (prefix, chunks, query) request, chunk spans included.

    Chat models: the prefix is the system message; a template without a system role (Mistral's
    refuses one) gets it as the first paragraph of the user message instead. Base models: the
    same text without a template.
    """
    body = CHUNK_SEPARATOR.join(chunks)
    user = body + CHUNK_SEPARATOR + query
    if not has_chat_template(tokenizer):
        before, after = (prefix + CHUNK_SEPARATOR if prefix else ""), ""
    else:
        before, after = _around_user_message(tokenizer, prefix)
    spans, at = [], len(before)
    for chunk in chunks:
        spans.append(Span(at, at + len(chunk), chunk))
        at += len(chunk) + len(CHUNK_SEPARATOR)
    return PromptText(before + user + after, tuple(spans))


def _around_user_message(tokenizer: Any, prefix: str | None) -> tuple[str, str]:
    """What the chat template writes before and after the user message's content."""
    from jinja2.exceptions import TemplateError

    marker = SENTINEL.format("user")
    try:
        messages = [{"role": "system", "content": prefix}] if prefix else []
        before, after = render_chat(tokenizer, messages + [{"role": "user", "content": marker}]).split(marker)
    except TemplateError:  # no system role: the prefix opens the user message
        before, after = render_chat(tokenizer, [{"role": "user", "content": marker}]).split(marker)
        before += prefix + CHUNK_SEPARATOR
    return before, after
