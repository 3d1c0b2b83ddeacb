"""Bad input gets a clear error before any compute, or a documented fallback."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from cacheblend import BlendConfig, BlendEngine, UnsupportedModelError

CHUNK = "A short passage about tide tables and the harbour of Brest."


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"chunks": [], "query": "q"}, "chunks is empty"),
        ({"chunks": ["  \n "], "query": "q"}, "non-whitespace"),
        ({"chunks": [CHUNK]}, "chunks and a query"),
        ({"chunks": [CHUNK], "query": "q", "recompute_ratio": 1.5}, r"\[0, 1\]"),
        ({"chunks": [CHUNK], "query": "q", "recompute_ratio": -0.1}, r"\[0, 1\]"),
        ({"chunks": [CHUNK], "query": "q", "max_new_tokens": 0}, "max_new_tokens"),
        ({"chunks": [CHUNK], "query": "q", "temperature": -1.0}, "temperature"),
        ({"chunks": [CHUNK], "query": "q", "top_p": 0.0}, "top_p"),
        ({"prompt": ""}, "non-empty"),
        ({"prompt": "x", "chunks": [CHUNK]}, "either prompt"),
    ],
)
def test_bad_requests_raise_value_errors(make_engine, kwargs, match):
    engine = make_engine()
    with pytest.raises(ValueError, match=match):
        engine.generate(**kwargs)


def test_bad_warm_input_stores_nothing(make_engine):
    engine = make_engine()
    with pytest.raises(ValueError, match="non-whitespace"):
        engine.warm([CHUNK, ""])
    with pytest.raises(ValueError, match="must be a string"):
        engine.warm([CHUNK, None])
    assert len(engine.kv.stores.memory) == 0 and len(engine.kv.finder) == 0


def test_chunk_longer_than_the_context_window(make_engine):
    engine = make_engine()
    long = "word " * engine.context_window
    with pytest.raises(ValueError, match="exceeds the context window"):
        engine.warm([long])


def test_prompt_over_the_context_window_fails_before_compute(make_engine, monkeypatch):
    engine = make_engine()
    calls = []
    monkeypatch.setattr(engine.adapter, "embed", lambda ids: calls.append(ids))
    with pytest.raises(ValueError, match="context window"):
        engine.generate(prompt="word " * engine.context_window)
    assert calls == []


def test_same_chunk_twice_reuses_one_record(make_engine):
    engine = make_engine()
    engine.warm([CHUNK])
    pre = engine.prefill(prompt=f"{CHUNK}\n\n{CHUNK}\n\nWhat is it about?", recompute_ratio=0.0)
    n = engine.count_tokens(CHUNK)
    assert (pre.stats.chunk_hits, pre.stats.hit_tokens) == (2, 2 * n)


def test_unicode_chunks_round_trip(make_engine):
    engine = make_engine()
    text = "Ünïcödé — 東京 → 🚀 ✓ naïve café"
    engine.warm([text])
    pre = engine.prefill(chunks=[text], query="¿Qué?", recompute_ratio=0.0)
    assert pre.stats.chunk_hits == 1


def test_unsupported_architecture_names_the_supported_ones(tokenizer):
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100))
    with pytest.raises(UnsupportedModelError, match="llama.*mistral.*qwen2.*qwen3"):
        BlendEngine(model, tokenizer)


@pytest.mark.parametrize(
    "config, match",
    [
        ({"check_layers": (1, 1), "ratios": (0.2, 0.1)}, "increasing"),
        ({"check_layers": (1, 2), "ratios": (0.1, 0.2)}, "must not increase"),
        ({"check_layers": (1,), "ratios": (0.1, 0.2)}, "same length"),
        ({"selector": "magic"}, "selector must be one of"),
        ({"measure": "q"}, "measure must be one of"),
        ({"ratios": (float("nan"),)}, r"\[0, 1\]"),
    ],
)
def test_bad_configs(config, match):
    with pytest.raises(ValueError, match=match):
        BlendConfig(**config)


def test_check_layer_beyond_the_model(make_engine):
    with pytest.raises(ValueError, match="does not exist"):
        make_engine(check_layers=(9,))


def test_bad_device_and_dtype():
    with pytest.raises(ValueError, match="device"):
        BlendEngine.from_pretrained("x", device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA"):
            BlendEngine.from_pretrained("x", device="cuda")
    with pytest.raises(ValueError, match="dtype"):
        BlendEngine.from_pretrained("x", device="cpu", dtype="float8")


def test_with_ratio_scales_a_gradual_schedule():
    cfg = BlendConfig(check_layers=(1, 3), ratios=(0.3, 0.15))
    assert cfg.with_ratio(0.05).ratios == pytest.approx((0.1, 0.05))
    assert cfg.with_ratio(1.0).ratios == (1.0, 1.0)
    assert cfg.with_ratio(0.0).schedule() == {0: 0.0}


def test_stream_rejects_an_over_long_prompt_at_the_call(make_engine):
    engine = make_engine()
    with pytest.raises(ValueError, match="context window"):
        engine.stream(prompt="word " * engine.context_window)  # no next() needed


def test_a_call_config_that_changes_what_keys_the_kv_is_refused_not_ignored(make_engine):
    """``prefill(config=)`` used to read only the blend knobs of a config and silently drop its
    neighbours / chunk context / lead records / kv dtype; now that is a ValueError naming them, and
    ``with_kv_of`` says "the blend knobs only" explicitly."""
    engine = make_engine("llama")  # neighbours=0, kv_dtype float32
    engine.warm([CHUNK])
    req = dict(chunks=[CHUNK], query="What about tides?")
    with pytest.raises(ValueError, match=r"neighbours=1 \(the engine's: 0\).*kv_dtype='float16'"):
        engine.prefill(**req, config=BlendConfig(selector="random"))
    mine = BlendConfig(selector="random", ratios=(0.3,)).with_kv_of(engine.config)
    assert mine.kv_differences(engine.config) == {} and mine.selector == "random" and mine.recompute_ratio == 0.3
    a = engine.prefill(**req, config=mine)
    from dataclasses import replace

    b = engine.prefill(**req, config=replace(engine.config, selector="random", ratios=(0.3,)))
    assert torch.equal(a.output.logits, b.output.logits)
    assert a.stats.recomputed_tokens + a.stats.head_tokens == b.stats.recomputed_tokens + b.stats.head_tokens  # (a computed
    # the head, b read it: tests/core/test_head_cache.py)


def test_a_custom_selector_is_kept_for_call_configs_and_never_silently_switched(tokenizer):
    from tiny_models import tiny_model

    calls = []

    def first_tokens(cand, budget):
        calls.append(budget)
        return torch.arange(min(budget, cand.positions.shape[0]), device=cand.positions.device)

    cfg = BlendConfig(kv_dtype="float32", neighbours=0)
    engine = BlendEngine(tiny_model("llama"), tokenizer, config=cfg, selector=first_tokens)
    engine.warm([CHUNK])
    req = dict(chunks=[CHUNK], query="What about tides?")
    engine.prefill(**req, config=cfg.with_ratio(0.5))  # another ratio: the custom selector still picks
    assert calls and calls[-1] > 0
    with pytest.raises(ValueError, match="custom selector.*'random'"):
        engine.prefill(**req, config=BlendConfig(selector="random").with_kv_of(cfg))


def test_a_request_is_validated_and_tokenized_once_and_reused_as_it_is(make_engine):
    from cacheblend import ContextLengthError, Request

    engine = make_engine("llama")
    engine.warm([CHUNK])
    req = engine.request(chunks=[CHUNK], query="What about tides?")
    assert isinstance(req, Request) and req.ids == engine.token_ids(req.text.text)
    assert [req.text.text[s.start : s.end] for s in req.text.chunks] == [CHUNK]
    assert engine.request(req) is req  # passes through: nothing searched or tokenized again
    with pytest.raises(ValueError, match="already holds its chunks"):
        engine.prefill(req, query="another question")
    a, b = engine.prefill(req), engine.prefill(chunks=[CHUNK], query="What about tides?")
    assert torch.equal(a.output.logits, b.output.logits) and a.stats.hit_tokens == b.stats.hit_tokens > 0
    with pytest.raises(ContextLengthError, match="context window") as err:
        engine.request("word " * engine.context_window)
    assert err.value.tokens >= err.value.window == engine.context_window
    assert len(engine.token_ids("word " * engine.context_window)) >= engine.context_window  # counting never raises


def test_an_unknown_generation_option_is_named(make_engine):
    engine = make_engine("llama")
    with pytest.raises(ValueError, match=r"unknown generation option\(s\) temprature; known: max_new_tokens, stop, temperature"):
        engine.stream(chunks=[CHUNK], query="q", temprature=0.5)
