"""CacheBlendLLM: a LangChain text-completion LLM (``BaseLLM``) over a cacheblend engine.

The drop-in for ``HuggingFacePipeline`` in string-prompt chains. For chat models (the bundled
one is) the prompt string is sent as one user message through the model's chat template, which
is what an instruction-tuned model expects; ``apply_chat_template=False`` sends it raw (for base
models there is no template and the prompt is always raw).

Callbacks: unlike ``BaseChatModel``, ``BaseLLM.stream()`` does not fire ``on_llm_new_token``
for the chunks ``_stream`` yields (langchain-core 1.8), so here both ``_stream`` and
``_generate`` fire it, once per text piece.

Batches: ``llm.batch(prompts)`` and ``llm.generate(prompts)`` hand every prompt to one
``_generate``, which reads their streams in turn (``cacheblend.integrations.interleave``): the
prefills run one after another, and the answers share the engine's decode steps.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseLLM
from langchain_core.outputs import Generation, GenerationChunk, LLMResult
from pydantic import Field

from cacheblend.integrations import Usage, interleave, iterate_in_thread

from .params import CacheBlendParams, Finished, response_metadata, usage_metadata


class CacheBlendLLM(CacheBlendParams, BaseLLM):
    """Text-in, text-out LLM with CacheBlend KV reuse for chunks warmed at indexing time.

    Each generation's ``generation_info`` holds ``finish_reason``, ``usage`` (LangChain's usage
    shape, ``input_token_details.cache_read`` = prompt tokens reused from the cache) and
    ``blend_stats`` (the engine's BlendStats: ttft_s, recomputed_tokens, chunk_hits, ...).
    """

    apply_chat_template: bool = Field(
        default=True,
        description="Chat models: wrap the prompt as one user message in the model's chat template "
        "(what instruction-tuned models expect). False sends the prompt string unchanged.",
    )

    @property
    def _llm_type(self) -> str:
        return "cacheblend"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {**super()._identifying_params, "apply_chat_template": self.apply_chat_template}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> dict[str, Any]:
        return {**self.ls_params(stop, kwargs), "ls_model_type": "llm"}

    def render(self, engine: Any, prompt: str) -> str:
        """The string the engine sees for ``prompt``."""
        if self.apply_chat_template and engine.is_chat_model:
            return engine.render_chat([{"role": "user", "content": prompt}])
        return prompt

    def _events(self, prompt: str, stop: list[str] | None, kwargs: dict) -> Iterator[str | Finished]:
        return self.generate_events(stop, kwargs, lambda engine: self.render(engine, prompt))

    def _generate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        done: list[Finished] = [None] * len(prompts)
        for i, event in interleave([self._events(p, stop, kwargs) for p in prompts]):
            if isinstance(event, Finished):
                done[i] = event
            elif run_manager:
                run_manager.on_llm_new_token(event, chunk=GenerationChunk(text=event))
        return _result(done)

    async def _agenerate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        done: list[Finished] = [None] * len(prompts)
        events = iterate_in_thread(lambda: interleave([self._events(p, stop, kwargs) for p in prompts]))
        async for i, event in events:
            if isinstance(event, Finished):
                done[i] = event
            elif run_manager:
                await run_manager.on_llm_new_token(event, chunk=GenerationChunk(text=event))
        return _result(done)

    def _stream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        for event in self._events(prompt, stop, kwargs):
            if isinstance(event, Finished):
                yield _last(event)  # empty text: no token, no callback
                continue
            chunk = GenerationChunk(text=event)
            if run_manager:
                run_manager.on_llm_new_token(event, chunk=chunk)
            yield chunk

    async def _astream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[GenerationChunk]:
        async for event in iterate_in_thread(lambda: self._events(prompt, stop, kwargs)):
            if isinstance(event, Finished):
                yield _last(event)
                continue
            chunk = GenerationChunk(text=event)
            if run_manager:
                await run_manager.on_llm_new_token(event, chunk=chunk)
            yield chunk


def _info(done: Finished) -> dict[str, Any]:
    meta = response_metadata(done.model, done.generation.stats)
    return {
        "finish_reason": meta["finish_reason"],
        "usage": dict(usage_metadata(done.generation.stats)),
        "blend_stats": meta["blend_stats"],
    }


def _last(done: Finished) -> GenerationChunk:
    """The closing chunk of a stream: no text, the generation's info."""
    return GenerationChunk(text="", generation_info=_info(done))


def _result(done: list[Finished]) -> LLMResult:
    generations = [[Generation(text=d.generation.text, generation_info=_info(d))] for d in done]
    total = sum((Usage.of(d.generation.stats) for d in done), Usage())
    usage = {
        "prompt_tokens": total.prompt_tokens,
        "completion_tokens": total.completion_tokens,
        "total_tokens": total.total_tokens,
        "cache_read_tokens": total.cached_tokens,
    }
    model = done[0].model if done else None
    return LLMResult(generations=generations, llm_output={"token_usage": usage, "model_name": model})
