"""BlendStatsHandler: collects the BlendStats of every CacheBlendLLM call made by LlamaIndex.

Query engines do not return the LLM's raw response, so the reuse figures (hits, reused tokens,
TTFT) are read where LlamaIndex reports LLM calls: its callback manager. Register the handler on
``Settings.callback_manager`` or pass ``callback_manager=`` to ``as_query_engine``: the query
engine hands its callback manager to the LLM and replaces the LLM's own (so a handler attached
only to ``llm.callback_manager`` sees nothing once the LLM is used by a query engine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cacheblend import BlendStats
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.callbacks.base_handler import BaseCallbackHandler
from llama_index.core.callbacks.schema import CBEventType, EventPayload

from .llm import blend_stats


@dataclass
class LLMCall:
    """One finished LLM call: its stats and what was sent (a prompt string or chat messages)."""

    stats: BlendStats
    prompt: str | None = None
    messages: list[ChatMessage] | None = None


class BlendStatsHandler(BaseCallbackHandler):
    """Records an ``LLMCall`` for every LLM event whose response came from a CacheBlendLLM."""

    def __init__(self) -> None:
        super().__init__(event_starts_to_ignore=[], event_ends_to_ignore=[])
        self.calls: list[LLMCall] = []

    def on_event_start(
        self, event_type: CBEventType, payload: dict[str, Any] | None = None, event_id: str = "", **kwargs: Any
    ) -> str:
        return event_id

    def on_event_end(
        self, event_type: CBEventType, payload: dict[str, Any] | None = None, event_id: str = "", **kwargs: Any
    ) -> None:
        if event_type != CBEventType.LLM or not payload:
            return
        response = payload.get(EventPayload.RESPONSE) or payload.get(EventPayload.COMPLETION)
        stats = blend_stats(response)
        if stats is not None:
            messages = payload.get(EventPayload.MESSAGES)
            self.calls.append(LLMCall(stats, payload.get(EventPayload.PROMPT), list(messages) if messages else None))

    def start_trace(self, trace_id: str | None = None) -> None:
        return None

    def end_trace(self, trace_id: str | None = None, trace_map: dict[str, list[str]] | None = None) -> None:
        return None

    def reset(self) -> None:
        self.calls.clear()

    @property
    def last(self) -> BlendStats:
        """The stats of the most recent call (IndexError if none)."""
        return self.calls[-1].stats
