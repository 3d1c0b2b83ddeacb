"""Tokenizing a prompt once, exactly as the model's tokenizer does, and chunks as they appear in it.

The prompt is tokenized as one string (``encode_prompt``): a chat-template rendering already holds
its BOS, so special tokens are added only when the text does not start with the BOS token; the ids
are then those of ``apply_chat_template(tokenize=True)`` or ``tokenizer(prompt)``, whichever path
made the text. A chunk is tokenized on its own the way it tokenizes after a line break
(``encode_chunk``), which is how LangChain and LlamaIndex place retrieved texts (joined by blank
lines, after a newline); character offsets then map each chunk token to the prompt token with the
same text and id (``assemble.py``). Tokens at a chunk's edges that merged with neighbouring text
("Context: The" -> " The") have no partner and are recomputed.

The context a chunk is warmed behind must not change from one day to the next: a chat template
that writes today's date into its system header (Llama 3.2's ``strftime_now``) is rendered with a
pinned date for it, or every stored chunk key would change at midnight.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from .request import SENTINEL, has_chat_template, render_chat

CHUNK_BREAK = "\n"  # chunks are tokenized as they are after a line break
PINNED_DATE = datetime.datetime(2024, 7, 26)  # Llama 3's own default ``date_string``
_DATE_FORMATS = ("%d %b %Y", "%d %B %Y", "%Y-%m-%d", "%B %d, %Y", "%b %d, %Y", "%m/%d/%Y", "%A, %B %d, %Y")


@dataclass(frozen=True)
class Encoding:
    """Token ids and each token's character span ``(start, end)`` in the encoded text."""

    ids: list[int]
    offsets: list[tuple[int, int]]


def encode_prompt(tokenizer: Any, text: str) -> Encoding:
    """The ids the model's own tokenizer gives the whole prompt: one BOS, never two."""
    bos = getattr(tokenizer, "bos_token", None)
    add = not (bos and text.startswith(bos))
    return _encode(tokenizer, text, add)


def encode_chunk(tokenizer: Any, text: str) -> Encoding:
    """A chunk's tokens as they appear after a line break; offsets relative to the chunk."""
    enc = _encode(tokenizer, CHUNK_BREAK + text, add_special_tokens=False)
    n = len(CHUNK_BREAK)
    kept = [(i, (a - n, b - n)) for i, (a, b) in zip(enc.ids, enc.offsets) if a >= n]
    return Encoding([i for i, _ in kept], [o for _, o in kept])


def _encode(tokenizer: Any, text: str, add_special_tokens: bool) -> Encoding:
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"cacheblend needs a fast tokenizer (with offsets); got {type(tokenizer).__name__}")
    enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    return Encoding(list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]])


def chat_header(tokenizer: Any) -> str | None:
    """What the chat template puts before the first user message (system header included), with
    any date in it pinned to ``PINNED_DATE``."""
    if not has_chat_template(tokenizer):
        return None
    marker = SENTINEL.format("lead")
    messages = [{"role": "user", "content": marker}]
    before = datetime.datetime.now()
    text = render_chat(tokenizer, messages, add_generation_prompt=False, date_string=PINNED_DATE.strftime("%d %b %Y"))
    return _pin_dates(text.split(marker)[0], {before, datetime.datetime.now()})


def _pin_dates(text: str, days: set[datetime.datetime]) -> str:
    for day in days:
        for fmt in _DATE_FORMATS:
            text = text.replace(day.strftime(fmt), PINNED_DATE.strftime(fmt))
    return text


def chunk_context_ids(tokenizer: Any, mode: str) -> list[int]:
    """The tokens every chunk is warmed behind (``BlendConfig.chunk_context``): the chat template's
    system header (``system``; a BOS for models without a template), the BOS (``bos``) or nothing."""
    lead = chat_header(tokenizer) if mode == "system" else None
    if lead:
        return encode_prompt(tokenizer, lead).ids
    bos = getattr(tokenizer, "bos_token_id", None)
    return [bos] if mode != "none" and bos is not None else []
