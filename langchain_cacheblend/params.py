"""What ChatCacheBlend and CacheBlendLLM share: their fields, the engine, per-call options, usage.

Both classes are thin: they turn LangChain input into one prompt string and hand it to
``BlendEngine.stream``. The engine finds the texts of warmed chunks inside that string (any
order, any template), so a chain that formats retrieved documents its own way still reuses their
KV. Everything here is plain data plus small helpers; the engine (torch, transformers) is
imported on first use only, so importing the package and building a model stay cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_core.messages.ai import UsageMetadata
from pydantic import Field, PrivateAttr

from cacheblend import BUNDLED_MODEL
from cacheblend.integrations import EngineFields, Usage

if TYPE_CHECKING:
    from cacheblend import BlendEngine, BlendStats, Generation

PROVIDER = "cacheblend"

# Options a call may override: ``model.invoke(x, max_tokens=5)`` or ``model.bind(seed=1)``.
CALL_OPTIONS = ("model", "max_tokens", "temperature", "top_p", "top_k", "seed", "recompute_ratio")
# Keywords LangChain itself may pass through to ``_generate``/``_stream``; they carry no option.
_PLUMBING = ("stream",)


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


class CacheBlendParams(EngineFields):
    """Fields and helpers common to the chat model and the LLM (a pydantic mixin): the shared
    engine fields plus LangChain's name for the answer length."""

    max_tokens: int = Field(default=256, ge=1, description="Most tokens to generate.")

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
    usage = Usage.of(stats)
    return UsageMetadata(
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        input_token_details={"cache_read": usage.cached_tokens},
    )


def response_metadata(model: str, stats: BlendStats) -> dict[str, Any]:
    """``model_name``, ``finish_reason`` and the engine's blend statistics (TTFT, hits, ...)."""
    return {
        "model_name": model,
        "model_provider": PROVIDER,
        "finish_reason": stats.finish_reason,
        "blend_stats": stats.as_dict(),
    }
