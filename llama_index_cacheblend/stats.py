"""BlendStatsHandler: collects the BlendStats of every CacheBlendLLM call LlamaIndex makes.

Query engines do not return the LLM's raw response, so the reuse figures (hits, reused tokens,
TTFT) are read where LlamaIndex reports finished LLM calls. This uses the instrumentation
dispatcher, not the older callback manager, on purpose: LlamaIndex overwrites an LLM's
``callback_manager`` when it is used (``index.as_query_engine`` installs the index's manager,
fixed when the index was built; ``get_response_synthesizer`` installs ``Settings.callback_manager``),
so a callback handler sees calls or not depending on construction order. Dispatcher events
reach the root dispatcher whatever the LLM's callback manager is.

    with record_blend_stats() as stats:
        index.as_query_engine(llm=llm).query("...")
    print(stats.last.reused_tokens, stats.last.ttft_s)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import llama_index.core.instrumentation as instrument
from cacheblend.result import BlendStats
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent, LLMCompletionEndEvent

from .llm import blend_stats


@dataclass
class LLMCall:
    """One finished LLM call: its stats and what was sent (a prompt string or chat messages)."""

    stats: BlendStats
    prompt: str | None = None
    messages: list[ChatMessage] | None = None


class BlendStatsHandler(BaseEventHandler):
    """Records an ``LLMCall`` for every finished call whose response came from a CacheBlendLLM."""

    _calls: list[LLMCall] = PrivateAttr(default_factory=list)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    @classmethod
    def class_name(cls) -> str:
        return "BlendStatsHandler"

    def handle(self, event: Any, **kwargs: Any) -> None:
        if not isinstance(event, (LLMChatEndEvent, LLMCompletionEndEvent)):
            return
        stats = blend_stats(event.response)
        if stats is None:
            return
        call = LLMCall(
            stats,
            prompt=getattr(event, "prompt", None),
            messages=list(event.messages) if isinstance(event, LLMChatEndEvent) else None,
        )
        with self._lock:
            self._calls.append(call)

    @property
    def calls(self) -> list[LLMCall]:
        with self._lock:
            return list(self._calls)

    @property
    def last(self) -> BlendStats:
        """The stats of the most recent call (IndexError if none)."""
        return self.calls[-1].stats

    def reset(self) -> None:
        with self._lock:
            self._calls.clear()


@contextmanager
def record_blend_stats() -> Iterator[BlendStatsHandler]:
    """A BlendStatsHandler attached to LlamaIndex's root dispatcher for the ``with`` block."""
    dispatcher = instrument.get_dispatcher()
    handler = BlendStatsHandler()
    dispatcher.add_event_handler(handler)
    try:
        yield handler
    finally:
        dispatcher.event_handlers = [h for h in dispatcher.event_handlers if h is not handler]
