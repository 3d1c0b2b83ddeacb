"""The doubt gate (``BlendConfig.doubt_margin``): where the blend is unsure of its next token, the
prompt is prefilled again at ``doubt_ratio`` and decoding goes on from there.

Proved on a tiny random Llama (fp32) against a plain transformers forward of the tokenizer's own
ids: a gate that fires at the first token answers exactly full prefill's greedy answer; one that
fires at step k keeps the blend's first k tokens and continues exactly as full prefill does after
them; a gate that never fires changes nothing.
"""

import pytest
import torch

from cacheblend import BlendConfig
from cacheblend.generation.doubt import top_margin

CHUNKS = [
    "The lighthouse keeper of Brannock paints the lamp room green every spring.",
    "Quillmere's mayor is a retired sailor who keeps a parrot named Odile.",
    "The only bridge in Tessaly Vale has seven arches and a toll house.",
]
ASK = dict(chunks=CHUNKS, query="What colour is the lamp room?", prefix="Answer briefly.")
TOKENS = 12


def _engine(make_engine, **gate):
    engine = make_engine(ratios=(0.0,), **gate)  # full reuse: the blend furthest from full prefill
    engine.warm(CHUNKS)
    return engine


@torch.inference_mode()
def _greedy(model, ids: list[int], count: int) -> list[int]:
    """Plain transformers greedy decoding without a cache: the reference."""
    out = list(ids)
    for _ in range(count):
        out.append(int(model(input_ids=torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(ids):]


def _margins(pre, tokens: list[int]) -> list[float]:
    """The margin the gate reads before each pick of ``tokens`` (the decode path's own logits)."""
    return [top_margin(pre.resume(tokens[:i])[1]) for i in range(len(tokens))]


@pytest.mark.parametrize("bad", [{"doubt_margin": -0.1}, {"doubt_margin": 1.5}, {"doubt_margin": True},
                                 {"doubt_margin": "0.1"}, {"doubt_ratio": 0.0}, {"doubt_ratio": 1.2}])
def test_bad_gate_settings_are_refused_by_name(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        BlendConfig(**bad)


def test_a_gate_in_doubt_at_the_first_token_answers_as_full_prefill(make_engine):
    engine = _engine(make_engine, doubt_margin=1.0)  # every margin is below 1: it fires at once
    plain = _engine(make_engine)
    blend = plain.generate(**ASK, max_new_tokens=TOKENS)
    gated = engine.generate(**ASK, max_new_tokens=TOKENS)
    ids = engine.request(**ASK).ids
    assert gated.token_ids == _greedy(engine.adapter.model, ids, len(gated.token_ids))
    assert gated.token_ids != blend.token_ids  # full reuse of a random model answers otherwise
    s = gated.stats
    assert s.doubt_step == 0 and s.redone_tokens == blend.stats.recomputed_tokens
    assert (s.recomputed_tokens, s.reused_tokens, s.recompute_ratio) == (s.prompt_tokens, 0, 1.0)


def test_a_gate_in_doubt_mid_answer_keeps_what_it_said_and_goes_on_as_full_prefill(make_engine):
    plain = _engine(make_engine)
    pre = plain.prefill(**ASK)
    said = plain.generate_from(pre, max_new_tokens=TOKENS).token_ids
    m = _margins(pre, said)
    k = next(i for i in range(1, len(m)) if m[i] < min(m[:i]))  # the first step less sure than all before it
    threshold = (m[k] + min(m[:k])) / 2
    engine = _engine(make_engine, doubt_margin=threshold)
    gated = engine.generate(**ASK, max_new_tokens=TOKENS)
    assert gated.stats.doubt_step == k and gated.token_ids[:k] == said[:k]
    ids = engine.request(**ASK).ids
    assert gated.token_ids[k:] == _greedy(engine.adapter.model, ids + said[:k], len(gated.token_ids) - k)
    assert gated.stats.redone_tokens == pre.stats.recomputed_tokens
    assert gated.stats.completion_tokens == len(gated.token_ids)


def test_a_gate_that_never_doubts_changes_nothing_and_a_prefill_at_its_ratio_has_none(make_engine):
    plain, engine = _engine(make_engine), _engine(make_engine, doubt_margin=1e-30)
    want, got = plain.generate(**ASK, max_new_tokens=TOKENS), engine.generate(**ASK, max_new_tokens=TOKENS)
    assert got.token_ids == want.token_ids and got.stats.doubt_step is None and got.stats.redone_tokens == 0
    assert engine.prefill(**ASK).doubt is not None
    assert engine.prefill(**ASK, recompute_ratio=1.0).doubt is None  # already what the gate would redo
    half = _engine(make_engine, doubt_margin=1.0, doubt_ratio=0.5)
    assert half.prefill(**ASK, recompute_ratio=0.5).doubt is None
    redo = half.generate(**ASK, max_new_tokens=TOKENS).stats
    assert redo.doubt_step == 0 and redo.recompute_ratio == 0.5 and 0 < redo.reused_tokens < redo.prompt_tokens


def test_the_commands_take_the_gate_and_a_flag_left_out_keeps_the_models():
    from cacheblend.cli import _parser

    for command in (["serve"], ["ask", "q", "--dir", "d"], ["bench"]):
        assert _parser().parse_args([*command, "--doubt-margin", "0.02"]).doubt_margin == 0.02
        assert _parser().parse_args(command).doubt_margin is None
    assert BlendConfig.for_model("qwen2.5-0.5b-instruct", doubt_margin=None) == BlendConfig.for_model("qwen2.5-0.5b-instruct")
    assert BlendConfig.for_model("a/folder", doubt_margin=0.02, neighbours=None) == BlendConfig(doubt_margin=0.02)
