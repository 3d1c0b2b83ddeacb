"""The gap between a chunk's two records (blending/gap.py) and ``selector="draft+gap"`` on tiny models.

Checked: the gap is each row's V distance between the record it reads and its lead record, computed
here from the stored records, each layer scaled by its mean squared V norm (1e-5); 0 on the first
chunk (it reads its lead record) and on rows no record covers; None when a later chunk has no lead
record of its own. Through the engine, ``draft+gap`` recomputes the always-kept rows plus the top of
the draft's score times the gap; where the gap is None, or a config stores each chunk once, it is
the draft's blend, bit for bit.
"""

from dataclasses import replace

import pytest
import torch

from cacheblend import BlendConfig
from cacheblend.blending.blend import blend_prefill
from cacheblend.blending.check import Check
from cacheblend.blending.draft import DraftSelector, draft_stage
from cacheblend.blending.gap import record_gap
from cacheblend.blending.selection import NoneSelector, SinkSelector
from cacheblend.blending.selectors import make_selector
from cacheblend.prefilling import Prefiller
from cacheblend.prompts.assemble import aligned_rows, assemble, chunk_encodings

from test_equivalence import CHUNKS, QUESTION

GAP = dict(neighbours=1, lead_alone=True, selector="draft+gap", draft_tokens=3, question_layers="last_third")


def _parts(engine, order=(1, 2, 0)):
    """A request over ``CHUNKS`` in ``order``: (request, chunk encodings, records read, lead records, Assembled)."""
    req = engine.request(chunks=[CHUNKS[i] for i in order], query=QUESTION)
    chunks = chunk_encodings(req.text, engine.kv.encode)
    ids = [list(c.ids) for c in chunks]
    records, leads = engine.kv.records(ids), engine.kv.records(ids, lead_from=0)
    return req, chunks, records, leads, assemble(req.text, req.encoding, chunks, records, engine.adapter.device, True)


def test_the_gap_is_each_rows_distance_between_its_two_records(make_engine):
    engine = make_engine("llama", **GAP)
    engine.warm(CHUNKS)
    req, chunks, records, leads, asm = _parts(engine)
    n = len(req.ids)
    gap = record_gap(asm.places, records, leads, n)
    places = [aligned_rows(req.encoding, span, c) for span, c in zip(req.text.chunks, chunks)]
    assert [p[1:] for p in asm.places] == [tuple(p) for p in places if p[0]]
    lead_v = torch.cat([lead.kv[:, 1, :, cols].float() for lead, (_, cols) in zip(leads, places)], dim=2)
    scale = lead_v.pow(2).sum((1, 3)).mean(1)  # [layers]
    expected = torch.zeros(n)
    for i, (read, lead, (rows, cols)) in enumerate(zip(records, leads, places)):
        assert (read.key == lead.key) == (i == 0)  # the first chunk reads its lead record
        moved = (read.kv[:, 1, :, cols].float() - lead.kv[:, 1, :, cols].float()).pow(2).sum((1, 3))
        expected[rows] = (moved / scale[:, None]).sum(0)
    torch.testing.assert_close(gap, expected, rtol=1e-5, atol=1e-7)
    assert float(gap[places[0][0]].abs().max()) == 0 and float(gap[places[1][0]].min()) > 0
    assert float(gap[~asm.input.reused].abs().max()) == 0  # the template and the question: no record
    assert record_gap(asm.places, records, records, n) is None  # no later chunk has a lead record of its own
    assert record_gap([], [], [], n) is None


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_draft_gap_recomputes_the_top_of_the_drafts_score_times_the_gap(make_engine, family):
    engine = make_engine(family, **GAP)
    engine.warm(CHUNKS)
    req, _, records, leads, asm = _parts(engine)
    inp, n = asm.input, len(req.ids)
    inp.gap = record_gap(asm.places, records, leads, n)
    selector = make_selector(engine.config)
    assert selector == DraftSelector("last_third", tokens=3, gap=True) and selector.needs_gap
    with torch.inference_mode():
        _, asked = draft_stage(engine.adapter, inp, selector.fusion, 3)
        out = blend_prefill(engine.adapter, inp, selector, {0: 0.3})
    score = asked.score(inp.reused, inp.chunk_offsets) * inp.gap  # [N]
    check = Check.of(inp, NoneSelector())
    candidates = torch.nonzero(inp.reused).flatten()
    budget = int(0.3 * candidates.numel() + 0.5)
    picked = candidates[torch.topk(score[candidates], budget).indices]
    expected = torch.cat([torch.nonzero(check.keep_always).flatten(), picked]).sort().values
    assert torch.equal(out.active_rows[-1], expected)
    assert float(inp.gap[picked].min()) > 0  # the first chunk, gap 0, is never picked for it

    through = engine.prefill(req, config=engine.config.with_ratio(0.3))  # the engine reads both records
    assert set(through.output.active_rows[-1].tolist()) & set(candidates.tolist()) == set(picked.tolist())
    draft = engine.prefill(req, config=replace(engine.config, selector="draft").with_ratio(0.3))
    assert through.output.recomputed == draft.output.recomputed
    assert not torch.equal(through.output.active_rows[-1], draft.output.active_rows[-1])  # the gap moved the pick


def test_without_a_lead_record_draft_gap_is_the_draft(make_engine):
    """A later chunk whose lead record is lost from every tier: the lookup returns its other record,
    the gap is None and the blend is the draft's, bit for bit."""
    engine = make_engine("llama", **GAP)
    engine.warm(CHUNKS)

    def records(chunks, lead_from=None, lead_weight=1.0):
        out = engine.kv.records(chunks, lead_from, lead_weight)
        if lead_from == 0:
            out[2] = engine.kv.records(chunks)[2]  # chunk 2's lead record lost: its neighbour-warmed one
        return out

    req = engine.request(chunks=[CHUNKS[i] for i in (1, 2, 0)], query=QUESTION)
    config = engine.config.with_ratio(0.3)
    gapped = Prefiller(engine.adapter, engine.kv.encode, records, config).run(req)
    draft = Prefiller(engine.adapter, engine.kv.encode, records, replace(config, selector="draft")).run(req)
    assert torch.equal(gapped.output.active_rows[-1], draft.output.active_rows[-1])
    assert torch.equal(gapped.output.logits, draft.output.logits)


@pytest.mark.parametrize("one", [dict(neighbours=0), dict(lead_alone=False)], ids=["alone", "no-lead"])
def test_with_one_record_per_chunk_draft_gap_is_the_draft(make_engine, one):
    """An engine storing each chunk once (warmed alone, or behind a neighbour without a lead record)
    has no gap to read: ``draft+gap`` asks for no second record and blends as the draft, bit for bit
    (so SmolLM2's catalogue default keeps working with ``neighbours=0``)."""
    engine = make_engine("llama", **(GAP | one))
    engine.warm(CHUNKS)
    asked = []

    def records(chunks, lead_from=None, lead_weight=1.0):
        asked.append(lead_from)
        return engine.kv.records(chunks, lead_from, lead_weight)

    req = engine.request(chunks=[CHUNKS[i] for i in (1, 2, 0)], query=QUESTION)
    config = engine.config.with_ratio(0.3)
    gapped = Prefiller(engine.adapter, engine.kv.encode, records, config).run(req)
    assert asked == [None]  # the records the prompt reads, and no lead records beside them
    draft = Prefiller(engine.adapter, engine.kv.encode, records, replace(config, selector="draft")).run(req)
    assert torch.equal(gapped.output.active_rows[-1], draft.output.active_rows[-1])
    assert torch.equal(gapped.output.logits, draft.output.logits)


def test_draft_gap_refuses_a_check_layers_auto_budget_and_sinks_forward_it():
    with pytest.raises(ValueError, match="auto_signal 'deviation' does not fit selector 'draft\\+gap'"):
        BlendConfig(selector="draft+gap", auto_budget=True)  # a check layer's signal: its stage 2 has none
    wrapped = make_selector(BlendConfig(selector="draft+gap", sinks=2))
    assert isinstance(wrapped, SinkSelector) and wrapped.needs_gap
    assert not make_selector(BlendConfig(selector="draft")).needs_gap
