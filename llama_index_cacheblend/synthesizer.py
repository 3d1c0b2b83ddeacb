"""WholeChunkSynthesizer: one LLM call over the retrieved nodes, each kept whole.

Why: LlamaIndex's default ``compact`` mode joins the node texts with blank lines and, when they
overflow the context window, re-splits the joined text into windows (with overlap) and refines
an answer across several calls. Every node cut by a window boundary is no longer its warmed text,
so its KV cannot be reused (it is computed, correctly), and each extra refine call is a full
prefill of a new prompt. ``simple_summarize`` truncates and, in llama-index-core 0.14.25, renders
the chunk list's Python repr into the prompt, so no node matches.

This synthesizer never re-splits or truncates: it keeps, in retrieval order, every node whose
whole text still fits (with ``num_output`` tokens left for the answer, counted with the model's
own tokenizer) and answers in one call with the standard text-QA template; the node texts are
joined with blank lines exactly as ``compact`` does when everything fits.

Cost: nodes that do not fit are dropped whole (a ``DroppedNodesWarning`` says how many) instead
of being summarised in refine passes; use it when ``similarity_top_k * chunk_size`` fits the
window (the common RAG case), and ``compact``/``refine`` when recall over very long contexts
matters more than latency. Use:

    index.as_query_engine(llm=llm, response_synthesizer=WholeChunkSynthesizer(llm))
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.prompts import BasePromptTemplate
from llama_index.core.prompts.default_prompt_selectors import DEFAULT_TEXT_QA_PROMPT_SEL
from llama_index.core.prompts.mixin import PromptDictType
from llama_index.core.response_synthesizers.base import BaseSynthesizer
from llama_index.core.types import RESPONSE_TEXT_TYPE

from .llm import CacheBlendLLM

SEPARATOR = "\n\n"  # what LlamaIndex's repack joins node texts with


class DroppedNodesWarning(UserWarning):
    """Some retrieved nodes did not fit the context window and were left out whole."""


class WholeChunkSynthesizer(BaseSynthesizer):
    """Answers over whole retrieved nodes in one call; never re-splits, truncates or refines."""

    def __init__(
        self,
        llm: CacheBlendLLM,
        text_qa_template: BasePromptTemplate | None = None,
        streaming: bool = False,
        callback_manager: CallbackManager | None = None,
    ) -> None:
        if not isinstance(llm, CacheBlendLLM):
            raise TypeError(
                f"WholeChunkSynthesizer needs a CacheBlendLLM (it counts tokens with the model's tokenizer), "
                f"got {type(llm).__name__}"
            )
        super().__init__(llm=llm, callback_manager=callback_manager, streaming=streaming)
        self._text_qa_template = text_qa_template or DEFAULT_TEXT_QA_PROMPT_SEL

    def _get_prompts(self) -> PromptDictType:
        return {"text_qa_template": self._text_qa_template}

    def _update_prompts(self, prompts: PromptDictType) -> None:
        if "text_qa_template" in prompts:
            self._text_qa_template = prompts["text_qa_template"]

    def fit(self, query_str: str, text_chunks: Sequence[str]) -> list[str]:
        """The chunks, whole and in their order, whose prompt leaves ``num_output`` tokens free.

        First fit: a chunk too large for the room left is skipped and later, smaller ones may still
        be kept. Empty chunks are skipped. ValueError if no chunk fits at all.
        """
        llm: CacheBlendLLM = self._llm
        template = self._text_qa_template.partial_format(query_str=query_str)
        budget = llm.metadata.context_window - llm.metadata.num_output
        chunks = [c for c in text_chunks if c.strip()]
        kept: list[str] = []
        for chunk in chunks:
            prompt = llm.format_template(template, context_str=SEPARATOR.join([*kept, chunk]))
            if llm.engine.count_tokens(prompt) <= budget:
                kept.append(chunk)
        if chunks and not kept:
            raise ValueError(
                f"no retrieved node fits the {llm.metadata.context_window}-token context window with "
                f"{llm.metadata.num_output} tokens reserved for the answer; use smaller chunks or a lower max_new_tokens"
            )
        if len(kept) < len(chunks):
            warnings.warn(
                f"{len(chunks) - len(kept)} of {len(chunks)} retrieved nodes do not fit the context window "
                "and were left out whole",
                DroppedNodesWarning,
                2,
            )
        return kept

    def _request(self, query_str: str, text_chunks: Sequence[str]) -> tuple[BasePromptTemplate, str]:
        template = self._text_qa_template.partial_format(query_str=query_str)
        return template, SEPARATOR.join(self.fit(query_str, text_chunks))

    def get_response(self, query_str: str, text_chunks: Sequence[str], **response_kwargs: Any) -> RESPONSE_TEXT_TYPE:
        template, context = self._request(query_str, text_chunks)
        if self._streaming:
            return self._llm.stream(template, context_str=context, **response_kwargs)
        return self._llm.predict(template, context_str=context, **response_kwargs) or self._empty_response

    async def aget_response(
        self, query_str: str, text_chunks: Sequence[str], **response_kwargs: Any
    ) -> RESPONSE_TEXT_TYPE:
        template, context = self._request(query_str, text_chunks)
        if self._streaming:
            return await self._llm.astream(template, context_str=context, **response_kwargs)
        return await self._llm.apredict(template, context_str=context, **response_kwargs) or self._empty_response
