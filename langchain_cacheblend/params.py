"""What ChatCacheBlend and CacheBlendLLM share: their fields, the engine, per-call options, usage.

Both classes are thin: they turn LangChain input into one prompt string and hand it to
``BlendEngine.stream``. The engine finds the texts of warmed chunks inside that string (any
order, any template), so a chain that formats retrieved documents its own way still reuses their
KV. Everything here is plain data plus small helpers; the engine (torch, transformers) is
imported on first use only, so importing the package and building a model stay cheap.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from langchain_core.messages.ai import UsageMetadata
from langchain_core.runnables.config import run_in_executor
from pydantic import BaseModel, Field, PrivateAttr

if TYPE_CHECKING:
    from cacheblend import BlendEngine, BlendStats, Generation

# Equal to ``cacheblend.BUNDLED_MODEL`` (a test checks); spelled out so that importing this
# package does not import torch.
BUNDLED_MODEL = "smollm2-135m-instruct"

PROVIDER = "cacheblend"

# Options a call may override: ``model.invoke(x, max_tokens=5)`` or ``model.bind(seed=1)``.
CALL_OPTIONS = ("model", "max_tokens", "temperature", "top_p", "top_k", "seed", "recompute_ratio")
# Keywords LangChain itself may pass through to ``_generate``/``_stream``; they carry no option.
_PLUMBING = ("stream",)

T = TypeVar("T")


def resolve_engine(engine: BlendEngine | str | None = None) -> BlendEngine:
    """An engine given as itself, as a model id/alias (the process-wide shared engine for it, on
    the default device), or None (the bundled model's shared engine)."""
    import cacheblend

    if engine is None or isinstance(engine, str):
        return cacheblend.shared_engine(engine or BUNDLED_MODEL)
    if not isinstance(engine, cacheblend.BlendEngine):
        raise ValueError(f"engine must be a BlendEngine, a model id or None; got {type(engine).__name__}")
    return engine


@dataclass
class Finished:
    """The last event of a generation: which model answered, and the engine's Generation."""

    model: str
    generation: Generation


class CacheBlendParams(BaseModel):
    """Fields and helpers common to the chat model and the LLM (a pydantic mixin)."""

    model: str = Field(
        default=BUNDLED_MODEL,
        description="HF model id, local folder, .gguf file, or the bundled alias. Instances with the same "
        "model, device and dtype share one engine: one copy of the weights and one KV store.",
    )
    device: str = Field(default="auto", description="'cpu', 'cuda', 'cuda:N' or 'auto'.")
    dtype: str | None = Field(
        default=None, description="'float32', 'bfloat16' or 'float16'; None: fp32 on CPU, bf16 on CUDA."
    )
    recompute_ratio: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Fraction of reused chunk tokens recomputed (CacheBlend's r). None: the engine's "
        "measured default (~0.15). 1.0 is a full prefill (no cache read), 0.0 full reuse.",
    )
    max_tokens: int = Field(default=256, ge=1, description="Most tokens to generate.")
    temperature: float = Field(default=0.0, ge=0.0, description="Sampling temperature; 0 is greedy.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass; 1.0 disables it.")
    top_k: int = Field(default=0, ge=0, description="Sample among the k likeliest tokens; 0 disables it.")
    seed: int | None = Field(default=None, description="Seed for sampling (temperature > 0); fixes the output.")
    stop: list[str] | None = Field(
        default=None,
        description="Stop strings (any length, any number of tokens); they never appear in the output. "
        "A call's own `stop` replaces these.",
    )

    _engine: Any = PrivateAttr(default=None)  # (model, device, dtype) -> the shared engine

    @property
    def _identifying_params(self) -> dict[str, Any]:
        """What makes two instances answer differently (LangChain's cache and tracing key)."""
        return {
            "model": self.model,
            "device": self.device,
            "dtype": self.dtype,
            "recompute_ratio": self.recompute_ratio,
        }

    def get_engine(self, model: str | None = None) -> BlendEngine:
        """The shared engine for ``model`` (default: this instance's), loaded on first use."""
        import cacheblend

        key = (model or self.model, self.device, self.dtype)
        if self._engine is not None and self._engine[0] == key:
            return self._engine[1]
        engine = cacheblend.shared_engine(key[0], device=self.device, dtype=self.dtype)
        if key[0] == self.model:
            self._engine = (key, engine)
        return engine

    def get_token_ids(self, text: str) -> list[int]:
        """Token ids from the model's own tokenizer (LangChain's default would fetch GPT-2's)."""
        return list(self.get_engine().tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate_events(
        self, stop: list[str] | None, kwargs: dict[str, Any], render: Callable[[BlendEngine], str]
    ) -> Iterator[str | Finished]:
        """Text pieces as the engine produces them, then one ``Finished``.

        Per-call options override the fields; ``render(engine)`` builds the prompt string. Lazy:
        nothing (not even loading the engine) happens before the first ``next``. Unknown keywords
        are a ValueError: a misspelt ``max_token=5`` must not be silently ignored.
        """
        unknown = sorted(set(kwargs) - set(CALL_OPTIONS) - set(_PLUMBING))
        if unknown:
            raise ValueError(
                f"{type(self).__name__} got unsupported call options {unknown}; it accepts {list(CALL_OPTIONS)}"
            )
        opts = {k: kwargs.get(k, getattr(self, k)) for k in CALL_OPTIONS}
        engine = self.get_engine(opts["model"])
        stream = engine.stream(
            render(engine),
            max_new_tokens=opts["max_tokens"],
            temperature=opts["temperature"],
            top_p=opts["top_p"],
            top_k=opts["top_k"],
            seed=opts["seed"],
            recompute_ratio=opts["recompute_ratio"],
            stop=list(stop if stop is not None else self.stop or []),
        )
        yield from stream
        yield Finished(opts["model"], stream.result)

    def ls_params(self, stop: list[str] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        """LangSmith's standard tracing parameters (a per-call ``model`` wins)."""
        params: dict[str, Any] = {
            "ls_provider": PROVIDER,
            "ls_model_name": kwargs.get("model", self.model),
            "ls_temperature": kwargs.get("temperature", self.temperature),
            "ls_max_tokens": kwargs.get("max_tokens", self.max_tokens),
        }
        stops = stop if stop is not None else self.stop
        if stops:
            params["ls_stop"] = list(stops)
        return params


def usage_metadata(stats: BlendStats) -> UsageMetadata:
    """Token counts in LangChain's shape; ``cache_read`` is the prompt tokens served from chunk KV
    (not recomputed)."""
    return UsageMetadata(
        input_tokens=stats.prompt_tokens,
        output_tokens=stats.completion_tokens,
        total_tokens=stats.prompt_tokens + stats.completion_tokens,
        input_token_details={"cache_read": stats.reused_tokens},
    )


def response_metadata(model: str, stats: BlendStats) -> dict[str, Any]:
    """``model_name``, ``finish_reason`` and the engine's blend statistics (TTFT, hits, ...)."""
    return {
        "model_name": model,
        "model_provider": PROVIDER,
        "finish_reason": stats.finish_reason,
        "blend_stats": stats.as_dict(),
    }


_DONE = object()


async def aiterate(make: Callable[[], Iterator[T]]) -> AsyncIterator[T]:
    """Yields from the blocking iterator ``make()`` without blocking the event loop.

    ``make`` (which may load the engine) and every ``next`` run in LangChain's executor, which
    copies the context (callbacks, tracing) into the worker. Each engine step is a self-contained
    ``torch.inference_mode`` call, so steps may run on different worker threads.
    """
    iterator = await run_in_executor(None, make)
    while True:
        item = await run_in_executor(None, next, iterator, _DONE)
        if item is _DONE:
            return
        yield item
