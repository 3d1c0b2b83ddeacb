"""OpenAI response bodies and SSE chunks for chat and text completions.

``usage.prompt_tokens_details.cached_tokens`` is the number of prompt tokens whose KV came from
cached chunks, or from the prompt's cached head, and was not recomputed (``BlendStats.reused_tokens``):
the field LangChain reports as ``cache_read``. The ``cacheblend`` usage extension adds chunk hits and
misses and the head's tokens.
"""

from __future__ import annotations

import json
import time
import uuid

from ..integrations.usage import Usage
from ..result import BlendStats


def usage(stats: BlendStats) -> dict:
    return Usage.of(stats).openai() | {
        "cacheblend": {
            "chunk_hits": stats.chunk_hits,
            "chunk_misses": stats.chunk_misses,
            "recomputed_tokens": stats.recomputed_tokens,
            "chunk_tokens": stats.hit_tokens,
            "head_tokens": stats.head_tokens,  # the prompt's head read from the head cache (part of cached_tokens)
            "recompute_ratio": stats.recompute_ratio,  # with "auto": the ratio chosen for this request
            "budget_signal": stats.budget_signal,  # ... and the signal that chose it (None otherwise)
            "draft_margin": stats.draft_margin,  # how sure full reuse was of a draft selector's draft (None: no draft)
            "first_stage_tokens": stats.first_stage_tokens,  # rows a two-stage selector's first pass computed (0: none)
            "draft_verified": stats.draft_verified,  # answer tokens a draft's one verifying forward picked
        },
    }


def sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


class Formatter:
    """Bodies of one response: ``chat`` (chat.completion) or ``text`` (text_completion)."""

    def __init__(self, kind: str, model: str) -> None:
        self.chat = kind == "chat"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
        self.model = model
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list, **extra) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices} | extra

    def response(self, text: str, stats: BlendStats) -> dict:
        choice = {"index": 0, "logprobs": None, "finish_reason": stats.finish_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
            return self._envelope("chat.completion", [choice], usage=usage(stats))
        choice["text"] = text
        return self._envelope("text_completion", [choice], usage=usage(stats))

    def chunk(self, text: str | None, finish_reason: str | None = None, with_usage: bool = False) -> str:
        """One streamed piece (``text`` None: the closing chunk that carries the finish reason)."""
        choice = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        extra = {"usage": None} if with_usage else {}
        if self.chat:
            choice["delta"] = {} if text is None else {"content": text}
            return sse(self._envelope("chat.completion.chunk", [choice], **extra))
        choice["text"] = text or ""
        return sse(self._envelope("text_completion", [choice], **extra))

    def opening(self, with_usage: bool) -> str | None:
        """Chat streams open with the assistant role (empty content), as OpenAI's do."""
        if not self.chat:
            return None
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return sse(self._envelope("chat.completion.chunk", [choice], **({"usage": None} if with_usage else {})))

    def usage_chunk(self, stats: BlendStats) -> str:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return sse(self._envelope(obj, [], usage=usage(stats)))
