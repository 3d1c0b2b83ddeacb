"""Turning a request into segments and token ids.

A prompt is a list of segments, each either a chunk (a warmed text whose KV may be reused) or
plain text (prefix, template, separators, question: always computed). Every segment is
tokenized on its own, so a chunk's tokens are the same wherever it lands and its key matches the
one computed at warm time; no separator string is ever spliced into the user's text.

For chat models the chat template wraps the segments: it is rendered once with sentinel strings
in place of the contents and the rendered text is split at the sentinels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .finder import ChunkFinder

CHUNK_SEPARATOR = "\n\n"
_SENTINEL = "\x00cacheblend-{}\x00"


@dataclass(frozen=True)
class Segment:
    text: str
    chunk: bool = False


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


def segments_from_prompt(prompt: str, finder: ChunkFinder) -> list[Segment]:
    """Splits ``prompt`` at the warmed chunk texts found in it."""
    segments, at = [], 0
    for span in finder.find(prompt):
        if span.start > at:
            segments.append(Segment(prompt[at : span.start]))
        segments.append(Segment(span.text, chunk=True))
        at = span.end
    if at < len(prompt):
        segments.append(Segment(prompt[at:]))
    return segments


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_chat(tokenizer: Any, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """The chat template applied to ``messages`` (role/content dicts), as a string."""
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt)


def request_segments(
    tokenizer: Any, chunks: Sequence[str], query: str, prefix: str | None, chat: bool
) -> list[Segment]:
    """Segments for an explicit (prefix, chunks, query) request.

    Chat models: the system message is ``prefix`` (or the template's default), the user message
    is the chunks joined by blank lines, a blank line, then the query. Base models: the same text
    without a template.
    """
    body = [Segment(c, chunk=True) for c in chunks]
    if not chat:
        head = [Segment(prefix + CHUNK_SEPARATOR)] if prefix else []
        return head + _join(body) + [Segment(CHUNK_SEPARATOR + query)]
    user = _SENTINEL.format("user")
    messages = [{"role": "system", "content": prefix}] if prefix else []
    messages.append({"role": "user", "content": user})
    before, after = render_chat(tokenizer, messages).split(user)
    return [Segment(before)] + _join(body) + [Segment(CHUNK_SEPARATOR + query + after)]


def _join(chunks: list[Segment]) -> list[Segment]:
    out: list[Segment] = []
    for i, seg in enumerate(chunks):
        if i:
            out.append(Segment(CHUNK_SEPARATOR))
        out.append(seg)
    return out


def chat_lead(tokenizer: Any) -> str | None:
    """What the chat template puts before the first user message (system header included)."""
    if not has_chat_template(tokenizer):
        return None
    user = _SENTINEL.format("lead")
    return render_chat(tokenizer, [{"role": "user", "content": user}], add_generation_prompt=False).split(user)[0]


def chunk_context_ids(tokenizer: Any, mode: str) -> list[int]:
    """The tokens every chunk is warmed behind (``BlendConfig.chunk_context``): the chat template's
    system header (``system``; a BOS for models without a template), the BOS (``bos``) or nothing."""
    lead = chat_lead(tokenizer) if mode == "system" else None
    if lead:
        return tokenize(tokenizer, lead)
    bos = getattr(tokenizer, "bos_token_id", None)
    return [bos] if mode != "none" and bos is not None else []


def tokenize(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` on its own, special tokens in the text recognised, none added."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def bos_to_add(tokenizer: Any) -> list[int]:
    """[bos_id] when the tokenizer adds a BOS token to every encoding by default, else []."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return []
    ids = tokenizer("a")["input_ids"]
    return [bos] if ids and ids[0] == bos else []
