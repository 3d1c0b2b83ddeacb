"""CacheBlendLLM: a LlamaIndex LLM whose prefill reuses the KV cache of warmed chunks.

LlamaIndex formats retrieved nodes into its own prompt templates; the engine finds the warmed
chunk texts inside the final prompt string (exact match, any order) and reuses their KV, so no
LlamaIndex prompt has to change. Every call (complete, chat, their streaming and async forms)
goes through one formatting step (``_completion_prompt`` / ``_chat_prompt``) and one generation
step (``_generate``), so all of them see the same prompt text and report the same usage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import cacheblend
from cacheblend.result import BlendStats, Generation
from cacheblend.integrations import EngineFields, Usage, iterate_in_thread
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
    TextBlock,
)
from llama_index.core.base.llms.generic_utils import messages_to_prompt as generic_messages_to_prompt
from llama_index.core.bridge.pydantic import BaseModel, Field, PrivateAttr
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.llms.llm import default_completion_to_prompt
from llama_index.core.prompts import BasePromptTemplate

if TYPE_CHECKING:  # the engine (and torch) load with the first model, not with this package
    from cacheblend import BlendEngine

GENERATION_KEYS = ("max_new_tokens", "recompute_ratio", "temperature", "top_p", "top_k", "seed", "stop")


class CacheBlendLLM(EngineFields, CustomLLM):
    """A local causal LM served by a cacheblend engine, for LlamaIndex.

    Instances built with the same ``model``/``device``/``dtype`` share one engine (weights and
    in-memory KV store) through ``cacheblend.shared_engine``; that is how a ``KVCacheWarmer`` and
    this LLM meet. ``raw["usage"]`` of every response carries the model's own token counts (read by
    ``TokenCountingHandler``) and ``raw["cacheblend"]`` the full ``BlendStats``.
    """

    max_new_tokens: int = Field(
        default=256, gt=0, description="Most tokens generated per call; also the room LlamaIndex reserves (num_output)."
    )

    _engine: BlendEngine = PrivateAttr()

    def __init__(self, **kwargs: Any) -> None:
        custom_messages = kwargs.get("messages_to_prompt")
        super().__init__(**kwargs)
        self._engine = cacheblend.shared_engine(self.model, device=self.device, dtype=self.dtype)
        if custom_messages is None:  # the model's own chat template; a user-given callable wins
            self.messages_to_prompt = ChatTemplate(self.model, self.device, self.dtype)

    def __getstate__(self) -> dict[str, Any]:
        return state_without_engine(self)

    @classmethod
    def class_name(cls) -> str:
        return "CacheBlendLLM"

    @property
    def engine(self) -> BlendEngine:
        """The shared engine (the same object a KVCacheWarmer for this model warms)."""
        return self._engine

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(
            context_window=self._engine.context_window,
            num_output=self.max_new_tokens,
            is_chat_model=self._engine.is_chat_model,
            model_name=self._engine.name,
        )

    def tokenize(self, text: str) -> list[int]:
        """The model's token ids for ``text`` (no special tokens added).

        Pass it where LlamaIndex counts tokens (``Settings.tokenizer = llm.tokenize``, a
        ``PromptHelper(tokenizer=...)``) so packing decisions use the model's own counts.
        """
        return list(self._engine.tokenizer(text, add_special_tokens=False)["input_ids"])

    def format_template(self, template: BasePromptTemplate, **kwargs: Any) -> str:
        """The exact prompt string ``predict(template, **kwargs)`` sends to the model."""
        if self.metadata.is_chat_model:
            return self._chat_prompt(self._get_messages(template, **kwargs))
        return self._completion_prompt(self._get_prompt(template, **kwargs), formatted=True)

    # -- the one formatting path ----------------------------------------------------------------
    def _completion_prompt(self, prompt: str, formatted: bool) -> str:
        """``formatted``: used as is. Otherwise a user-given ``completion_to_prompt`` applies; by
        default a chat model gets the prompt as the user turn after ``system_prompt``."""
        if formatted:
            return prompt
        if self.completion_to_prompt is not default_completion_to_prompt or not self._engine.is_chat_model:
            return self.completion_to_prompt(prompt)
        system = [ChatMessage(role=MessageRole.SYSTEM, content=self.system_prompt)] if self.system_prompt else []
        return self._chat_prompt([*system, ChatMessage(role=MessageRole.USER, content=prompt)])

    def _chat_prompt(self, messages: Sequence[ChatMessage]) -> str:
        return self.messages_to_prompt(messages)

    # -- the one generation path ----------------------------------------------------------------
    def _options(self, overrides: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(overrides) - set(GENERATION_KEYS))
        if unknown:
            raise ValueError(f"unsupported generation argument(s) {unknown}; supported: {list(GENERATION_KEYS)}")
        options = {key: getattr(self, key) for key in GENERATION_KEYS}
        options.update(overrides)
        return options

    def _check_length(self, prompt: str) -> None:
        n, window = self._engine.count_tokens(prompt), self._engine.context_window
        if n >= window:
            raise ValueError(
                f"the prompt has {n} tokens but {self._engine.name} has a {window}-token context window; "
                "retrieve fewer or smaller nodes (similarity_top_k, chunk_size) or use WholeChunkSynthesizer, "
                "which drops whole nodes to fit"
            )

    def _generate(self, prompt: str, overrides: dict[str, Any]) -> CompletionResponse:
        self._check_length(prompt)
        result = self._engine.generate(prompt, **self._options(overrides))
        return CompletionResponse(text=result.text, raw=usage_raw(result))

    def _stream(self, prompt: str, overrides: dict[str, Any]) -> CompletionResponseGen:
        """Validates now, computes lazily; the last response (empty delta) carries the usage."""
        self._check_length(prompt)
        stream = self._engine.stream(prompt, **self._options(overrides))

        def responses() -> Iterator[CompletionResponse]:
            text = ""
            for piece in stream:
                text += piece
                yield CompletionResponse(text=text, delta=piece)
            yield CompletionResponse(text=text, delta="", raw=usage_raw(stream.result))

        return responses()

    # -- LlamaIndex entry points ------------------------------------------------------------------
    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return self._generate(self._completion_prompt(prompt, formatted), kwargs)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        return self._stream(self._completion_prompt(prompt, formatted), kwargs)

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return _as_chat(self._generate(self._chat_prompt(messages), kwargs))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return (_as_chat(r) for r in self._stream(self._chat_prompt(messages), kwargs))

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return await asyncio.to_thread(self._generate, self._completion_prompt(prompt, formatted), kwargs)

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        responses = self._stream(self._completion_prompt(prompt, formatted), kwargs)  # validated now
        return iterate_in_thread(lambda: responses)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return _as_chat(await asyncio.to_thread(self._generate, self._chat_prompt(messages), kwargs))

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        responses = self._stream(self._chat_prompt(messages), kwargs)  # validated now

        async def chats() -> ChatResponseAsyncGen:
            async for response in iterate_in_thread(lambda: responses):
                yield _as_chat(response)

        return chats()


# -- the default messages_to_prompt ----------------------------------------------------------------
class ChatTemplate:
    """``messages_to_prompt`` default: the model's own chat template, ending with the assistant
    turn (role-prefixed lines for base models without a template).

    Pickles as its engine's key (model, device, dtype), so copies and unpickled LLMs get the
    process's shared engine back.
    """

    def __init__(self, model: str, device: str = "auto", dtype: str | None = None) -> None:
        self._key = (model, device, dtype)
        self._engine = cacheblend.shared_engine(model, device=device, dtype=dtype)

    def __call__(self, messages: Sequence[ChatMessage]) -> str:
        if not self._engine.is_chat_model:
            return generic_messages_to_prompt(messages)
        return self._engine.render_chat([{"role": _role(m), "content": _text(m, i)} for i, m in enumerate(messages)])

    def __repr__(self) -> str:
        return f"ChatTemplate({self._key[0]!r})"

    def __reduce__(self) -> tuple:
        return (ChatTemplate, self._key)


# -- helpers -------------------------------------------------------------------------------------
def state_without_engine(component: BaseModel) -> dict[str, Any]:
    """Pickle state of a component minus its ``_engine``, on copies.

    The engine is per process (``__init__`` gets it back from the public fields on unpickling)
    and holds locks; left in, pickle would serialise the weights before failing, and
    ``BaseComponent.__getstate__`` deletes what fails to pickle from the live object's fields.
    """
    state = BaseModel.__getstate__(component)
    private = {k: v for k, v in (state.get("__pydantic_private__") or {}).items() if k != "_engine"}
    return {**state, "__dict__": dict(state["__dict__"]), "__pydantic_private__": private}


def usage_raw(result: Generation) -> dict[str, Any]:
    """``raw`` for a response: OpenAI-style ``usage`` (what LlamaIndex's token counting reads)
    with the model's own counts, and the blend statistics under ``cacheblend``."""
    stats = result.stats
    return {"usage": Usage.of(stats).openai(), "cacheblend": stats.as_dict(), "finish_reason": stats.finish_reason}


def blend_stats(response: CompletionResponse | ChatResponse | Any) -> BlendStats | None:
    """The BlendStats of a CacheBlendLLM response (the last one of a stream), else None."""
    raw = getattr(response, "raw", None)
    if not isinstance(raw, dict) or "cacheblend" not in raw:
        return None
    return BlendStats(**raw["cacheblend"])


def _as_chat(response: CompletionResponse) -> ChatResponse:
    message = ChatMessage(role=MessageRole.ASSISTANT, content=response.text)
    return ChatResponse(message=message, delta=response.delta, raw=response.raw)


def _role(message: ChatMessage) -> str:
    return message.role.value if isinstance(message.role, MessageRole) else str(message.role)


def _text(message: ChatMessage, index: int) -> str:
    """The message's text; a text-only model refuses images, audio and other blocks loudly."""
    others = [type(b).__name__ for b in message.blocks if not isinstance(b, TextBlock)]
    if others:
        raise ValueError(f"message {index} has non-text content {others}; CacheBlendLLM serves text-only models")
    return message.content or ""
