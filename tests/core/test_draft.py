"""The ``draft`` selector (blending/draft.py) on tiny random models.

Its stage 1 decodes a draft over the full-reuse pass's cache, one row per token, and scores the
draft rows' attention. Checked here: the draft is what a plain transformers forward decodes greedily
over that cache; the score equals one full-reuse pass over the prompt and the draft together
(computed the slow way, every uncached row of it, as benchmarks/draft_score.py first did), with the
question's rows or without; stage 2 gets the prompt's own full-reuse caches; the rows are counted;
at ratio 1.0 the blend is a full prefill; bad settings are refused. A drafting pass verifies guessed
tokens: whatever the guesses, right, wrong or half right, the draft, its score and stage 2's caches
are the one-token-per-pass draft's, in fewer passes the better the guesses.
"""

from dataclasses import replace

import pytest
import torch

from cacheblend import BlendConfig
from cacheblend.blending.blend import reuse_pass
from cacheblend.blending.check import Check
from cacheblend.blending.draft import DraftSelector, draft_stage, prompt_lookup
from cacheblend.blending.question import Fusion, QuestionScore
from cacheblend.blending.selection import NoneSelector, SinkSelector
from cacheblend.blending.selectors import make_selector
from cacheblend.generation.doubt import top_margin

from test_equivalence import CHUNKS, QUESTION, assembled, assert_kv_close, hf_reference, request
from tiny_models import FAMILIES


def extended(inp, draft):
    """``inp`` with ``draft`` appended as uncached rows: the prompt and the draft as one prompt."""
    k = len(draft)
    pad = inp.cached.new_zeros((*inp.cached.shape[:3], k, inp.cached.shape[4]))
    return replace(inp, ids=torch.cat([inp.ids, torch.tensor(draft, dtype=inp.ids.dtype)]),
                   reused=torch.cat([inp.reused, inp.reused.new_zeros(k)]), cached=torch.cat([inp.cached, pad], dim=3),
                   chunk_offsets=torch.cat([inp.chunk_offsets, inp.chunk_offsets.new_zeros(k)]))


@torch.inference_mode()
def greedy_over(engine, out, n, tokens):
    """``tokens`` greedy tokens transformers' own forward decodes over ``out``'s cache, one at a time,
    and how sure it was of each (``top_margin``)."""
    cache, logits, greedy, margins = engine.adapter.make_cache(out.kv), out.logits, [], []
    for i in range(tokens):
        greedy.append(int(logits.argmax()))
        margins.append(top_margin(logits))
        step = engine.adapter.model(input_ids=torch.tensor([[greedy[-1]]]), cache=cache,
                                    position_ids=torch.tensor([[n + i]]), use_cache=True)
        logits = step.logits[0, -1].float()
    return greedy, margins


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("question", [False, True])
def test_the_draft_is_full_reuses_greedy_answer_and_its_score_one_pass_over_prompt_and_draft(make_engine, family, question):
    engine = make_engine(family)
    engine.warm(CHUNKS)
    inp = assembled(engine, request(engine, (1, 2, 0))).input
    model, n, fusion = engine.adapter, inp.ids.shape[0], Fusion("last_third")
    plain = reuse_pass(model, inp)
    with torch.inference_mode():
        out, asked = draft_stage(model, inp, fusion, 4, question)
    greedy, margins = greedy_over(engine, plain, n, 4)
    assert asked.draft == greedy and asked.margins == pytest.approx(margins, abs=1e-5)
    assert all(torch.equal(a, b) for pa, pb in zip(out.kv, plain.kv) for a, b in zip(pa, pb))  # stage 2's base
    # the draft's rows went into the room after the prompt's rows, which were not copied for it
    assert all(k.data_ptr() == g[0].data_ptr() and g.shape[2] == n + 4 for (k, _), g in zip(out.kv, out.grown))
    assert torch.equal(out.logits, plain.logits)

    ext = extended(inp, asked.draft)  # the slow way: every uncached row of prompt + draft in one pass
    asking = Check.of(ext, NoneSelector()).asking.clone()
    if not question:
        asking[:n] = False
    slow = QuestionScore(model, asking, fusion, keys=n)
    reuse_pass(model, ext, slow)
    assert asked.layers == slow.layers == list(fusion.layer_set(model.num_layers))
    assert asked.rows == slow.rows == 4 + (int(asking[:n].sum()) if question else 0)
    torch.testing.assert_close(asked.score(inp.reused, inp.chunk_offsets), slow.score(inp.reused, inp.chunk_offsets),
                               atol=1e-5, rtol=1e-4)
    assert out.recomputed == plain.recomputed + 4 and out.drafted == 4
    assert all(torch.equal(rows, torch.cat([p, torch.arange(n, n + 4)])) for rows, p in zip(out.active_rows, plain.active_rows))


@pytest.mark.parametrize("family", FAMILIES)
def test_guessed_tokens_change_nothing_but_the_passes(make_engine, family):
    """The draft of one token per pass (``lookahead=0``) against passes that verify guesses: the
    right continuation (one pass after the first token), always wrong guesses (a rejected row per
    pass), right then wrong, and prompt lookup's. The same tokens, the same score (1e-5), the same
    stage-2 caches; the rows computed and the passes counted."""
    engine = make_engine(family)
    engine.warm(CHUNKS)
    inp = assembled(engine, request(engine, (1, 2, 0))).input
    model, n, fusion, tokens = engine.adapter, inp.ids.shape[0], Fusion("last_third"), 6
    with torch.inference_mode():
        ref, ref_asked = draft_stage(model, inp, fusion, tokens, question=True, guesses=0)
    truth = ref_asked.draft
    assert ref_asked.passes == tokens and ref.recomputed == reuse_pass(model, inp).recomputed + tokens
    vocab = model.config.vocab_size
    guessers = {
        "right": (lambda draft, count: truth[len(draft): len(draft) + count], 1, 0),
        "wrong": (lambda draft, count: [(truth[len(draft)] + 1) % vocab][:count], tokens, tokens - 1),
        "half": (lambda draft, count: (truth[len(draft): len(draft) + 1] + [(truth[len(draft) + 1] + 1) % vocab]
                                       if count >= 2 else truth[len(draft): len(draft) + count]), 3, 2),
        "lookup": (None, None, None),
    }
    for name, (propose, passes, rejected) in guessers.items():
        with torch.inference_mode():
            out, asked = draft_stage(model, inp, fusion, tokens, True, *([propose] if propose else []))
        assert asked.draft == truth, name
        assert asked.margins == pytest.approx(ref_asked.margins, abs=1e-5), name  # each token's, once
        torch.testing.assert_close(asked.score(inp.reused, inp.chunk_offsets),
                                   ref_asked.score(inp.reused, inp.chunk_offsets), atol=1e-5, rtol=1e-4)
        assert asked.rows == ref_asked.rows
        assert all(torch.equal(a, b) for pa, pb in zip(out.kv, ref.kv) for a, b in zip(pa, pb)), name
        if passes is not None:
            assert (asked.passes, out.recomputed - ref.recomputed) == (passes, rejected), name
        drafting = out.active_rows[0][out.active_rows[0] >= n]
        assert drafting.shape[0] == out.recomputed - ref.recomputed + tokens and set(drafting.tolist()) == set(range(n, n + tokens))
        assert all(torch.equal(rows, out.active_rows[0]) for rows in out.active_rows)


def test_prompt_lookup_guesses_what_follows_the_longest_recent_match():
    propose = prompt_lookup(torch.tensor([5, 1, 2, 3, 9, 1, 2, 4, 7, 8, 2, 3, 6, 0]))
    assert propose([1, 2], 3) == [4, 7, 8]  # "1 2" last occurs before "4 7 8"
    assert propose([9, 2, 3], 2) == [6, 0]  # "2 3": the later of its two occurrences
    assert propose([11, 3], 5) == [6, 0]  # "3" alone where "11 3" does not occur; what is left
    assert propose([8], 0) == [] and propose([42], 3) == []  # nothing asked; nothing found
    assert propose([6, 0], 2) == []  # "6 0" ends the prompt: nothing follows it


def test_the_draft_rows_move_the_score(make_engine):
    """A score the draft did not change would make the selector the question selector again."""
    engine = make_engine("llama")
    engine.warm(CHUNKS)
    inp = assembled(engine, request(engine, (1, 2, 0))).input
    fusion = Fusion("last_third")
    asking = QuestionScore(engine.adapter, Check.of(inp, NoneSelector()).asking, fusion)
    reuse_pass(engine.adapter, inp, asking)
    with torch.inference_mode():
        scores = [draft_stage(engine.adapter, inp, fusion, 4, q)[1].score(inp.reused, inp.chunk_offsets) for q in (0, 1)]
    base = asking.score(inp.reused, inp.chunk_offsets)
    for a, b in ((scores[0], base), (scores[1], base), (scores[0], scores[1])):
        assert not torch.allclose(a[inp.reused], b[inp.reused], atol=1e-4)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_the_draft_selector_through_the_engine(make_engine, family):
    """``BlendConfig(selector="draft")``: ratio 1.0 is a full prefill (1e-5); at 30% stage 2 recomputes
    the question selector's budget and stage 1 is the full-reuse pass plus the draft's rows."""
    engine = make_engine(family, selector="draft", draft_tokens=3, question_layers="last_third")
    engine.warm(CHUNKS)
    req = engine.request(chunks=[CHUNKS[i] for i in (2, 0, 1)], query=QUESTION)
    inp = assembled(engine, req.text).input
    n = inp.ids.shape[0]
    full = engine.prefill(req, config=engine.config.with_ratio(1.0))
    logits, kv = hf_reference(engine, inp.ids)
    torch.testing.assert_close(full.output.logits, logits, atol=1e-5, rtol=1e-5)
    assert_kv_close(full.output.kv, kv, 1e-5)
    blended = engine.prefill(req, config=engine.config.with_ratio(0.3))
    asking = engine.prefill(req, config=replace(engine.config, selector="question").with_ratio(0.3))
    assert blended.output.recomputed == asking.output.recomputed < n
    assert blended.stats.first_stage_tokens == asking.stats.first_stage_tokens + 3
    assert blended.output.drafted == 3 and asking.output.drafted == 0
    # the first stage's time is reported, as part of the prefill's; a one-pass blend has none
    one_pass = engine.prefill(req, config=replace(engine.config, selector="deviation").with_ratio(0.3))
    assert all(0 < p.stats.first_stage_s < p.stats.prefill_s for p in (blended, asking))
    assert one_pass.stats.first_stage_s == 0.0
    # how sure full reuse was of the draft: its least sure token's margin; no draft, no margin
    with torch.inference_mode():
        _, drafted = draft_stage(engine.adapter, inp, Fusion("last_third"), 3)
    assert blended.stats.draft_margin == pytest.approx(min(drafted.margins), abs=1e-6)
    assert 0 <= blended.stats.draft_margin <= 1 and len(drafted.margins) == 3
    assert asking.stats.draft_margin is None and one_pass.stats.draft_margin is None


def test_sinks_keep_the_drafted_stage_and_bad_settings_are_refused():
    wrapped = make_selector(BlendConfig(selector="draft", sinks=2, draft_tokens=5))
    assert isinstance(wrapped, SinkSelector) and wrapped.first_stage.__self__.tokens == 5
    assert make_selector(BlendConfig(selector="draft")) == DraftSelector(tokens=8)
    for tokens in (0, 65, True, 2.5, "8"):
        with pytest.raises(ValueError, match="draft_tokens must be an integer in \\[1, 64\\]"):
            BlendConfig(selector="draft", draft_tokens=tokens)
        with pytest.raises(ValueError, match="draft tokens"):
            DraftSelector(tokens=tokens)
    for lookahead in (-1, True, 1.5):
        with pytest.raises(ValueError, match="draft lookahead"):
            DraftSelector(lookahead=lookahead)
    with pytest.raises(ValueError, match="auto_signal 'deviation' does not fit selector 'draft'"):
        BlendConfig(selector="draft", auto_budget=True)  # a check layer's signal: the draft's stage 2 has none


def _with_draft(pre, draft):
    return replace(pre, output=replace(pre.output, draft=list(draft)))


@pytest.mark.parametrize("family", FAMILIES)
def test_decoding_takes_the_draft_it_verifies_in_one_forward_and_gives_greedy_decodings_tokens(make_engine, family):
    """``Lockstep.verify_draft`` on one prefill whose draft is set by hand (any prefill decodes the
    same way): a draft that is the greedy answer is taken whole in one forward, with the pick after
    it (8 tokens); one wrong at its 4th token is taken up to it (3 picks); one whose first token is
    not the answer's, a sampled answer, or a limit the answer reaches first change what they
    should. Every answer is greedy decoding's tokens, and the text and stats say the same."""
    engine = make_engine(family)
    engine.warm(CHUNKS)
    pre = engine.prefill(chunks=CHUNKS, query=QUESTION)
    assert pre.output.draft == []  # deviation drafts nothing
    want = engine.generate_from(pre, max_new_tokens=16)
    ids = want.token_ids
    assert len(ids) == 16 and want.stats.draft_verified == 0, "the tiny model's greedy answer ends early"
    wrong = (ids[3] + 1) % engine.adapter.model.config.vocab_size
    for draft, verified in ((ids[:8], 8), (ids[:3] + [wrong] + ids[4:8], 3), ([wrong], 0), (ids[:20], 15)):
        got = engine.generate_from(_with_draft(pre, draft), max_new_tokens=16)
        assert got.token_ids == ids and got.text == want.text, (draft, verified)
        assert got.stats.draft_verified == verified and got.stats.completion_tokens == 16
    short = engine.generate_from(_with_draft(pre, ids[:8]), max_new_tokens=3)  # room for 2 picks after the first
    assert short.token_ids == ids[:3] and short.stats.draft_verified == 2 and short.stats.finish_reason == "length"
    stop = engine.tokenizer.decode(ids[4:6])  # a stop string the verified picks reach
    cut = engine.generate_from(_with_draft(pre, ids[:8]), max_new_tokens=16, stop=[stop])
    assert cut.text == engine.generate_from(pre, max_new_tokens=16, stop=[stop]).text and cut.stats.finish_reason == "stop"
    sampled = dict(max_new_tokens=16, temperature=0.8, seed=3)
    assert engine.generate_from(_with_draft(pre, ids[:8]), **sampled).token_ids == engine.generate_from(pre, **sampled).token_ids
    assert engine.generate_from(_with_draft(pre, ids[:8]), **sampled).stats.draft_verified == 0
    pieces = list(stream := engine.stream(chunks=CHUNKS, query=QUESTION, max_new_tokens=16))
    assert "".join(pieces) == stream.result.text == want.text  # no draft: the stream's own prefill


def test_the_draft_selectors_answer_is_greedy_decodings_with_its_draft_verified(make_engine):
    """Through the engine with ``selector="draft"``: the prefill carries its draft, and the answer,
    streamed or not, is the tokens the same prefill decodes without it."""
    engine = make_engine(selector="draft", draft_tokens=6)
    engine.warm(CHUNKS)
    req = engine.request(chunks=[CHUNKS[i] for i in (2, 0, 1)], query=QUESTION)
    pre = engine.prefill(req, config=engine.config.with_ratio(0.3))
    assert len(pre.output.draft) == 6
    got, want = engine.generate_from(pre, max_new_tokens=12), engine.generate_from(_with_draft(pre, []), max_new_tokens=12)
    assert got.token_ids == want.token_ids and want.stats.draft_verified == 0
    prefix = 0
    while prefix < 6 and got.token_ids[prefix] == pre.output.draft[prefix]:
        prefix += 1
    assert prefix > 0 and got.stats.draft_verified == prefix  # the blend at 30% begins as full reuse's answer did
    stream = engine.stream(req, recompute_ratio=0.3, max_new_tokens=12)  # the shared decode's path: first piece, then the draft
    pieces = list(stream)
    assert len(pieces) > 1 and "".join(pieces) == stream.result.text == want.text
    assert stream.result.token_ids == want.token_ids and stream.result.stats.draft_verified == prefix
