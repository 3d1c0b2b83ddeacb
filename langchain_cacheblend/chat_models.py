"""ChatCacheBlend: a LangChain chat model whose prefill reuses the KV of warmed chunks.

Swap it in for ``ChatOpenAI`` in an existing RAG chain and nothing else changes: the messages are
rendered with the model's own chat template into one prompt string, and the engine finds the
texts of warmed documents inside it wherever the chain put them (system message, user message,
any order, any separators). Documents that were never warmed are simply computed.

Token callbacks, exactly once per text piece on every path (langchain-core 1.8): ``stream()``,
``astream()`` and ``invoke`` when it decides to stream fire ``on_llm_new_token`` themselves for
each chunk ``_stream`` yields and call ``_stream`` WITHOUT a run manager; the v3 protocol path
(``stream_events(version="v3")``) passes one and fires only ``on_stream_event``. So ``_stream``
fires the token callback exactly when it is handed a run manager (which also matches older
langchain-core, where ``stream()`` passed it and fired nothing), and ``_generate`` always does.

``batch`` reads the inputs' ``stream()`` generators in turn (``cacheblend.integrations.interleave``):
each input keeps its own run (callbacks, tracing), the prefills run one after another, and the
answers share the engine's decode steps. Where only LangChain's own ``batch`` gives what the call
asks (an LLM cache, ``return_exceptions``, ``max_concurrency``, streaming disabled), it runs that:
``invoke`` on a thread pool, whose calls share the engine's steps too, less closely.
"""

from __future__ import annotations

import operator
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from functools import reduce
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.globals import get_llm_cache
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_chunk_to_message,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import get_config_list
from pydantic import Field

from cacheblend.integrations import interleave, iterate_in_thread

from .params import CacheBlendParams, Finished, response_metadata, usage_metadata

_ROLES = ((SystemMessage, "system"), (HumanMessage, "user"), (AIMessage, "assistant"))  # chunks subclass these
_CHAT_ROLES = ("system", "user", "assistant")


def to_chat_messages(messages: Sequence[BaseMessage]) -> list[dict[str, str]]:
    """LangChain messages as role/content dicts for the chat template; text content only.

    Raises ValueError for what a text-only model without tool calling cannot take: tool and
    function messages, AI messages carrying tool calls, and non-text content blocks (images,
    audio, files, ...). A message's ``name`` is dropped (chat templates have no place for it).
    """
    if not messages:
        raise ValueError("ChatCacheBlend needs at least one message")
    return [{"role": _role(m), "content": _text(m)} for m in messages]


def _role(message: BaseMessage) -> str:
    if isinstance(message, ChatMessage):
        if message.role in _CHAT_ROLES:
            return message.role
        raise ValueError(f"ChatMessage role {message.role!r} is not supported; use one of {_CHAT_ROLES}")
    if isinstance(message, (ToolMessage, FunctionMessage)):
        raise ValueError(
            f"{type(message).__name__} is not supported: ChatCacheBlend has no tool calling, so there "
            "are no tool results to send back"
        )
    if isinstance(message, AIMessage) and message.tool_calls:
        raise ValueError("an AIMessage with tool_calls is not supported: ChatCacheBlend has no tool calling")
    for kind, role in _ROLES:
        if isinstance(message, kind):
            return role
    raise ValueError(f"message type {type(message).__name__} is not supported")


def _text(message: BaseMessage) -> str:
    if isinstance(message.content, str):
        return message.content
    parts = []
    for block in message.content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(block.get("text", ""))
        else:
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise ValueError(
                f"{type(message).__name__} has a {kind!r} content block; ChatCacheBlend takes text only "
                "(the model reads no images, audio or files)"
            )
    return "".join(parts)


class ChatCacheBlend(CacheBlendParams, BaseChatModel):
    """Chat model over a cacheblend engine: CacheBlend KV reuse for chunks warmed at indexing time.

    Example:
        .. code-block:: python

            from langchain_cacheblend import CacheBlendFAISS, ChatCacheBlend

            store = CacheBlendFAISS.from_documents(docs, embeddings)  # warms each doc's KV
            llm = ChatCacheBlend(max_tokens=64)
            chain = prompt | llm  # any prompt that contains the retrieved documents
            msg = chain.invoke(...)
            msg.usage_metadata["input_token_details"]["cache_read"]  # prompt tokens reused
            msg.response_metadata["blend_stats"]["ttft_s"]

    ``usage_metadata.input_token_details.cache_read`` counts prompt tokens whose KV came from the
    cache and was not recomputed; ``response_metadata["blend_stats"]`` holds the engine's
    BlendStats (ttft_s, recomputed_tokens, chunk_hits, chunk_misses, ...).
    Tool calling and structured output are not supported (``bind_tools`` raises).
    """

    streaming: bool = Field(
        default=False, description="invoke() runs through the streaming path (callbacks fire either way)."
    )

    @property
    def _llm_type(self) -> str:
        return "cacheblend-chat"

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> dict[str, Any]:
        return {**self.ls_params(stop, kwargs), "ls_model_type": "chat"}

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: str | None = None, **kwargs: Any) -> Any:
        """Not supported: the engine has no tool-call parsing and the bundled model was not trained
        for tools. ``with_structured_output`` relies on this and fails the same way."""
        raise NotImplementedError(
            "ChatCacheBlend does not support tool calling (bind_tools / with_structured_output); "
            "parse the text output instead, e.g. with a LangChain output parser"
        )

    def get_num_tokens_from_messages(self, messages: list[BaseMessage], tools: Sequence | None = None) -> int:
        """Exactly the prompt tokens the model will see: the messages through its chat template
        (``trim_messages(..., token_counter=llm)`` then counts what really matters)."""
        if tools:
            raise NotImplementedError("ChatCacheBlend does not support tool calling")
        engine = self.get_engine()
        return len(engine.token_ids(engine.render_chat(to_chat_messages(messages))))

    def _events(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict) -> Iterator:
        chat = to_chat_messages(messages)  # validated before the engine is loaded

        def render(engine: Any) -> str:
            if not engine.is_chat_model:
                raise ValueError(f"model {self.model!r} has no chat template; use CacheBlendLLM for base models")
            return engine.render_chat(chat)

        return self.generate_events(stop, kwargs, render)

    def batch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[BaseMessage]:
        """Every input's answer, decoded together: see the module docstring."""
        configs = get_config_list(config, len(inputs))
        cached = self.cache is not False and (self.cache is not None or get_llm_cache() is not None)
        if (len(inputs) < 2 or return_exceptions or cached or self.disable_streaming
                or any(c.get("max_concurrency") is not None for c in configs)):
            return super().batch(inputs, config, return_exceptions=return_exceptions, **kwargs)
        chunks: list[list] = [[] for _ in inputs]
        for i, chunk in interleave([self.stream(x, c, **kwargs) for x, c in zip(inputs, configs)]):
            chunks[i].append(chunk)
        return [message_chunk_to_message(reduce(operator.add, c)) for c in chunks]

    # -- sync --------------------------------------------------------------------------------
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        for event in self._events(messages, stop, kwargs):
            if isinstance(event, Finished):
                return _result(event)
            if run_manager:
                run_manager.on_llm_new_token(event, chunk=_piece(event))
        raise AssertionError("the engine stream ended without a result")

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for event in self._events(messages, stop, kwargs):
            chunk = _last(event) if isinstance(event, Finished) else _piece(event)
            if run_manager and not isinstance(event, Finished):
                run_manager.on_llm_new_token(event, chunk=chunk)  # protocol path only: see the docstring
            yield chunk

    # -- async: the engine runs in a worker thread; the event loop stays free --------------------
    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        async for event in iterate_in_thread(_deferred(self._events, messages, stop, kwargs)):
            if isinstance(event, Finished):
                return _result(event)
            if run_manager:
                await run_manager.on_llm_new_token(event, chunk=_piece(event))
        raise AssertionError("the engine stream ended without a result")

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        async for event in iterate_in_thread(_deferred(self._events, messages, stop, kwargs)):
            chunk = _last(event) if isinstance(event, Finished) else _piece(event)
            if run_manager and not isinstance(event, Finished):
                await run_manager.on_llm_new_token(event, chunk=chunk)
            yield chunk


def _deferred(fn: Callable[..., Iterator], *args: Any) -> Callable[[], Iterator]:
    """``fn(*args)`` to be called in the worker thread (message validation included)."""
    return lambda: fn(*args)


def _piece(text: str) -> ChatGenerationChunk:
    return ChatGenerationChunk(message=AIMessageChunk(content=text))


def _last(done: Finished) -> ChatGenerationChunk:
    """The closing chunk: no text, the usage and blend stats (set once, so merging adds nothing twice)."""
    stats = done.generation.stats
    message = AIMessageChunk(
        content="",
        usage_metadata=usage_metadata(stats),
        response_metadata=response_metadata(done.model, stats),
        chunk_position="last",
    )
    return ChatGenerationChunk(message=message)


def _result(done: Finished) -> ChatResult:
    stats = done.generation.stats
    message = AIMessage(
        content=done.generation.text,
        usage_metadata=usage_metadata(stats),
        response_metadata=response_metadata(done.model, stats),
    )
    return ChatResult(generations=[ChatGeneration(message=message)])
