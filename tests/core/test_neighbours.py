"""Neighbour-aware warming (BlendConfig.neighbours): which passages a chunk is computed behind,
that its stored KV is exactly what the model computes there, how it is keyed, and that it
blends closer to full prefill on the real model."""

import pytest
import torch

from cacheblend import BlendConfig, BlendEngine
from cacheblend.neighbours import NeighbourIndex, behind
from cacheblend.stores import LEAD, chunk_key, model_fingerprint


SHIPS = [
    "The harbour of Kelm keeps three wooden ships: the Auk, the Tern and the Petrel, all built in Kelm.",
    "The Auk and the Tern, wooden ships of the Kelm harbour, sail to the salt islands every summer.",
    "The Petrel, the oldest wooden ship of Kelm harbour, was rebuilt after the storm of 1902.",
]
BEES = [
    "Beekeepers on the Varn hills move their hives to the heather fields late in July each year.",
    "Heather honey from the Varn hills is dark and thick; the beekeepers press it from the comb.",
]


def _ids(engine, texts):
    return [engine.kv.encode(t).ids for t in texts]


def test_index_finds_passages_on_the_same_topic_most_similar_first(tokenizer):
    index = NeighbourIndex()
    texts = SHIPS + BEES
    ids = [tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    index.add(texts, ids)
    near = index.nearest(ids, 2, exclude=texts)
    for i, picks in enumerate(near):
        assert texts[i] not in picks
        group = SHIPS if texts[i] in SHIPS else BEES
        assert picks[0] in group  # the nearest is on the same topic
    assert near[3] == [BEES[1], *near[3][1:]]  # BEES has one other passage; it comes first
    assert index.nearest(ids[:1], 0) == [[]]
    assert NeighbourIndex().nearest(ids[:1], 2) == [[]]
    index.add(texts[:1], ids[:1])  # a text already present is kept once
    assert len(index) == len(texts)


def test_behind_drops_the_least_similar_neighbours_that_do_not_fit():
    near = [[10, 11, 12], [20, 21]]  # most similar first; chunk context (2) + chunk (4) = 6 fixed tokens
    assert behind(near, 6, room=100) == [[20, 21], [10, 11, 12]]  # most similar placed next to the chunk
    assert behind(near, 6, room=9) == [[10, 11, 12]]
    assert behind(near, 6, room=6) == []


@pytest.mark.parametrize("bad", [-1, 9, True, 1.5, "2"])
def test_config_rejects_a_bad_neighbour_count(bad):
    with pytest.raises(ValueError, match="neighbours"):
        BlendConfig(neighbours=bad)


def test_neighbours_are_part_of_the_fingerprint_and_alone_keeps_the_old_one(make_engine):
    alone, behind2 = make_engine("llama"), make_engine("llama", neighbours=2)
    assert alone.kv.fingerprint != behind2.kv.fingerprint
    assert alone.kv.keys(SHIPS) != behind2.kv.keys(SHIPS)
    legacy = model_fingerprint(alone.adapter.model, alone.tokenizer, kv_dtype="float32", context_ids=alone.kv.context_ids)
    assert alone.kv.fingerprint == legacy  # stores warmed before neighbours existed stay valid


def _hf_chunk_kv(engine, context: list[int], chunk: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the chunk rows' (K after RoPE, V) of a plain transformers forward of context + chunk."""
    ids = torch.tensor([[*context, *chunk]])
    out = engine.adapter.model(input_ids=ids, use_cache=True)
    return [(layer.keys[0, :, -len(chunk):], layer.values[0, :, -len(chunk):]) for layer in out.cache.layers]


def _behind(engine, near: list[str]) -> list[int]:
    """The chunk context, then the neighbours ``near`` (most similar first) as placed: most similar last."""
    return [*engine.kv.context_ids, *(t for n in behind(_ids(engine, near), 0, 10**6) for t in n)]


def _assert_record_is(engine, text: str, context: list[int], variant: str = ""):
    """The stored record of ``text`` (its ``variant``) is the model's KV of it behind ``context``
    (K rotated to its positions there: records keep K before RoPE)."""
    (chunk,) = _ids(engine, [text])
    record = engine.kv.stores.get(chunk_key(engine.kv.fingerprint, chunk, variant))
    assert record is not None, f"no {variant or 'plain'} record of {text[:30]!r}"
    pos = torch.arange(len(context), len(context) + len(chunk))
    cos, sin = engine.adapter.rope(pos)
    from cacheblend.blending.rope import apply_rope

    for layer, (k, v) in enumerate(_hf_chunk_kv(engine, context, chunk)):
        ours_k = apply_rope(record.kv[layer, 0].float(), cos, sin)
        torch.testing.assert_close(ours_k, k, atol=1e-5, rtol=1e-5, msg=lambda m: f"K of layer {layer}: {m}")
        torch.testing.assert_close(record.kv[layer, 1].float(), v, atol=1e-5, rtol=1e-5)


def test_a_chunk_is_stored_as_computed_behind_its_two_nearest_passages(make_engine):
    engine = make_engine("llama", neighbours=2)
    engine.warm(SHIPS + BEES)
    near = engine.kv.neighbour_index.nearest(_ids(engine, [SHIPS[0]]), 2, exclude=[SHIPS[0]])[0]
    assert set(near) == set(SHIPS[1:])
    context = _behind(engine, near)
    _assert_record_is(engine, SHIPS[0], context)
    # alone, the same chunk's KV differs: the neighbours changed what it attended to
    alone = make_engine("llama")
    alone.warm(SHIPS[:1])
    (key,) = alone.kv.keys(SHIPS[:1])
    (key2,) = engine.kv.keys(SHIPS[:1])
    assert (alone.kv.stores.get(key).kv - engine.kv.stores.get(key2).kv).abs().amax() > 1e-3


def test_a_chunk_warmed_later_finds_neighbours_among_the_chunks_already_warmed(make_engine):
    engine = make_engine("llama", neighbours=1)
    engine.warm(SHIPS[:2] + BEES)
    engine.warm([SHIPS[2]])  # warmed on its own: its neighbour comes from what the engine knows
    near = engine.kv.neighbour_index.nearest(_ids(engine, [SHIPS[2]]), 1, exclude=[SHIPS[2]])[0]
    assert near[0] in SHIPS[:2]
    _assert_record_is(engine, SHIPS[2], _behind(engine, near))


def test_explicit_neighbours_are_used_as_given(make_engine):
    engine = make_engine("llama", neighbours=2)
    engine.warm([SHIPS[0]], behind=[[BEES[0], BEES[1]]])
    _assert_record_is(engine, SHIPS[0], [*engine.kv.context_ids, *_ids(engine, [BEES[1]])[0], *_ids(engine, [BEES[0]])[0]])
    before = engine.kv.stores.get(engine.kv.keys(SHIPS[:1])[0]).kv.clone()
    engine.warm([SHIPS[0]], behind=[[SHIPS[1]]])  # stored already: nothing is recomputed
    assert torch.equal(engine.kv.stores.get(engine.kv.keys(SHIPS[:1])[0]).kv, before)


def test_every_chunk_also_keeps_its_kv_warmed_alone_mostly_for_free(make_engine):
    """lead_alone (the default): each chunk's lead record is exactly its KV behind the chunk
    context alone. A chunk that is another's neighbour gets it from that chunk's forward (it sits
    right behind the chunk context there); only the others are computed alone."""
    engine = make_engine("llama", neighbours=1)
    assert BlendConfig().lead_alone and engine.kv.lead_alone
    texts = SHIPS + BEES
    engine.warm(texts)
    ctx = list(engine.kv.context_ids)
    for text in texts:
        _assert_record_is(engine, text, ctx, LEAD)
    near = {t: engine.kv.neighbour_index.nearest(_ids(engine, [t]), 1, exclude=[t])[0][0] for t in texts}
    size = {t: len(_ids(engine, [t])[0]) for t in texts}
    alone = [t for t in texts if t not in near.values()]
    assert alone and len(alone) < len(texts)
    assert engine.kv.tokens_warmed == sum(len(ctx) + size[near[t]] + size[t] for t in texts) + sum(len(ctx) + size[t] for t in alone)
    assert not make_engine("llama", neighbours=1, lead_alone=False).kv.lead_alone
    assert not make_engine("llama", lead_alone=True).kv.lead_alone  # warming alone: one record is both


def test_the_first_chunk_of_a_prompt_reads_its_lead_record(make_engine, tmp_path):
    """The first chunk reads the KV warmed alone, the others the KV warmed behind neighbours; a chunk
    lacking the record its place asks for uses its other one, and warm() adds only what is missing."""
    plain = make_engine("llama", neighbours=1, lead_alone=False)
    plain.warm(SHIPS + BEES, store_dir=tmp_path)
    engine = make_engine("llama", neighbours=1)
    engine.attach_store(tmp_path)
    assert engine.kv.fingerprint == plain.kv.fingerprint  # the same records; lead ones are extra keys
    ids = _ids(engine, [BEES[0], SHIPS[2], SHIPS[0]])
    fp = engine.kv.fingerprint
    assert [r.key for r in engine.kv.records(ids)] == [chunk_key(fp, i) for i in ids]  # no lead record yet
    assert engine.prefill(chunks=[BEES[0], SHIPS[2]], query="Which ship?").stats.chunk_hits == 2
    assert not engine.kv.is_warm(BEES[0])
    engine.warm(SHIPS + BEES)
    ctx = len(engine.kv.context_ids)
    assert engine.kv.tokens_warmed == sum(ctx + len(i) for i in _ids(engine, SHIPS + BEES))  # the lead records only
    assert engine.kv.is_warm(BEES[0])
    assert [r.key for r in engine.kv.records(ids)] == [chunk_key(fp, ids[0], LEAD), chunk_key(fp, ids[1]), chunk_key(fp, ids[2])]


def test_bad_explicit_neighbours_are_refused_before_any_compute(make_engine):
    alone = make_engine("llama")
    with pytest.raises(ValueError, match="warms chunks alone"):
        alone.warm(SHIPS[:1], behind=[[SHIPS[1]]])
    engine = make_engine("llama", neighbours=2)
    with pytest.raises(ValueError, match="one list of texts per text"):
        engine.warm(SHIPS[:2], behind=[[SHIPS[2]]])
    with pytest.raises(ValueError, match="list of texts"):
        engine.warm(SHIPS[:1], behind=[SHIPS[2]])
    assert not any(engine.kv.is_warm(t) for t in SHIPS)


def test_a_chunk_warmed_behind_neighbours_is_reused_wherever_it_lands(make_engine):
    """Reused in any order and beside any passages; at ratio 1.0 the answer is still full prefill's."""
    engine = make_engine("llama", neighbours=2)
    engine.warm(SHIPS + BEES)
    for chunks in ([BEES[0], SHIPS[2]], [SHIPS[2], BEES[1], SHIPS[0]]):
        assert engine.prefill(chunks=chunks, query="Which ship is oldest?").stats.chunk_hits == len(chunks)
        pre = engine.prefill(chunks=chunks, query="Which ship is oldest?", recompute_ratio=1.0)
        ids = engine.request(chunks=chunks, query="Which ship is oldest?").ids
        logits = engine.adapter.model(input_ids=torch.tensor([ids])).logits[0, -1]
        torch.testing.assert_close(pre.output.logits, logits, atol=1e-4, rtol=1e-4)


@pytest.mark.real_model
def test_real_model_default_warming_blends_closer_to_full_prefill(real_engine):
    """The default (chunks warmed behind a neighbour, the first chunk's KV warmed alone, deviation
    15%) is closer to full prefill than the same without lead records, itself closer than
    CacheBlend (chunks warmed alone, deviation 15%), itself closer than full reuse: mean KL over the
    full-prefill answers of development fact questions."""
    from cacheblend.tools.factset import questions
    from cacheblend.tools.quality import answer_kls

    assert BlendConfig().neighbours >= 1 and real_engine.kv.neighbours == BlendConfig().neighbours
    qs = questions("dev", 16)  # per question the gain varies a lot; over 60 it is 0.121 vs 0.197
    pool = sorted({p for q in questions("dev", 60) for p in q.passages})  # the split's 40 passages
    alone = BlendEngine(real_engine.adapter.model, real_engine.tokenizer, config=BlendConfig(neighbours=0))
    alone.warm(pool)
    real_engine.warm(pool)
    assert real_engine.kv.lead_alone
    plain = BlendEngine(real_engine.adapter.model, real_engine.tokenizer, config=BlendConfig(lead_alone=False))
    plain.kv.stores = real_engine.kv.stores  # the same records, read without the lead ones
    kl = {"reuse": [], "alone": [], "plain": [], "default": []}
    reqs = [dict(chunks=q.passages, query=q.question, prefix="Answer briefly from the passages.") for q in qs]
    fulls = [real_engine.prefill(**req, recompute_ratio=1.0) for req in reqs]
    refs = real_engine.generate_many(fulls, max_new_tokens=16)  # decoded together (generate_many)
    for q, req, full, ref in zip(qs, reqs, fulls, refs):
        pres = {
            "reuse": alone.prefill(**req, recompute_ratio=0.0),
            "alone": alone.prefill(**req),
            "plain": plain.prefill(**req),
            "default": real_engine.prefill(**req),
        }
        assert all(pre.stats.chunk_hits == len(q.passages) for pre in pres.values())
        for name, value in zip(pres, answer_kls(full, list(pres.values()), ref.token_ids)):
            kl[name].append(value)
    mean = {k: sum(v) / len(v) for k, v in kl.items()}
    assert mean["default"] < 0.85 * mean["plain"] < 0.85 * mean["alone"] < 0.85 * mean["reuse"], mean
