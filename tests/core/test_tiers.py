"""The store-tier protocol: every tier is a KVTier, a location names one tier, a new tier is one
module plus one SCHEMES line, and warming writes and copies by ``shared`` alone."""

from collections.abc import Sequence

import pytest
import torch

from cacheblend import DiskStore, MemoryStore, RedisStore
from cacheblend.stores import KVTier, open_tier, tier

TEXTS = [
    "The harbour of Kelm keeps three wooden ships: the Auk, the Tern and the Petrel, all built in Kelm.",
    "Beekeepers on the Varn hills move their hives to the heather fields late in July each year.",
    "Heather honey from the Varn hills is dark and thick; the beekeepers press it from the comb.",
]


class DictTier:
    """A whole new tier in a few lines: records in a dict that 'other processes' share."""

    shared = True

    def __init__(self, location: str, fingerprint: str, codec: str) -> None:
        self.location, self.records, self.asked = location, {}, 0

    def get_many(self, keys: Sequence[str]):
        self.asked += 1
        return [self.records.get(k) for k in keys]

    def put_many(self, records) -> None:
        self.records.update((r.key, r) for r in records)

    def contains_many(self, keys):
        return [k in self.records for k in keys]

    def texts(self):
        return [r.text for r in self.records.values()]


@pytest.fixture
def dict_scheme(monkeypatch):
    made: dict[str, DictTier] = {}

    def opener(location, fingerprint, codec):
        return made.setdefault(location, DictTier(location, fingerprint, codec))

    monkeypatch.setitem(tier.SCHEMES, "dict", opener)
    return made


def test_every_tier_is_a_kvtier(tmp_path):
    fp = "f" * 64
    for t in (MemoryStore(), DiskStore(tmp_path, fp), RedisStore("redis://127.0.0.1:1/0", fp)):
        assert isinstance(t, KVTier), type(t).__name__
    assert open_tier(tmp_path, fp).shared is False and open_tier("redis://127.0.0.1:1/0", fp).shared is True
    assert open_tier(str(tmp_path), fp).location == open_tier(tmp_path / "." , fp).location  # one spelling per place


def test_an_unknown_url_scheme_is_a_clear_error_not_a_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"no store tier serves s3://.*redis://"):
        open_tier("s3://bucket/kv", "f" * 64)
    assert not (tmp_path / "s3:").exists()


def test_a_new_tier_is_one_module_and_one_scheme_line(make_engine, dict_scheme):
    """Warming writes through to a shared tier; a second engine attached to the same location
    (another process, as far as the tier knows) reads every record from it and computes nothing;
    its blended prefill is bitwise the first engine's."""
    first = make_engine("llama")
    first.warm(TEXTS, store_dir="dict://kv")
    shared = dict_scheme["dict://kv"]
    assert set(shared.records) == set(first.kv.keys(TEXTS))
    second = make_engine("llama")
    assert first.kv.fingerprint == second.kv.fingerprint
    second.attach_store("dict://kv")  # learns the texts, so a raw prompt finds the chunks
    assert len(second.kv.finder) == len(TEXTS)
    a = first.prefill(chunks=TEXTS[::-1], query="Which ships?")
    b = second.prefill(chunks=TEXTS[::-1], query="Which ships?")
    assert b.stats.hit_tokens == a.stats.hit_tokens > 0
    assert torch.equal(a.output.logits, b.output.logits)
    assert second.kv.tokens_warmed == 0 and shared.asked >= 1


def test_warm_report_counts_what_was_computed_and_copied(make_engine, tmp_path, dict_scheme):
    engine = make_engine("llama")
    first = engine.kv.warmer.run(engine.kv.warmer.prepare(TEXTS), engine.kv.stores)  # memory only
    assert first.computed == len(TEXTS) and first.copied == 0 and first.tokens > 0
    again = engine.kv.warmer.run(engine.kv.warmer.prepare(TEXTS), engine.kv.stores)
    assert (again.computed, again.copied, again.tokens) == (0, 0, 0)  # idempotent: nothing to do
    disk = engine.attach_store(tmp_path)
    copy = engine.kv.warmer.run(engine.kv.warmer.prepare(TEXTS), engine.kv.stores, disk)
    assert (copy.computed, copy.copied, copy.tokens) == (0, len(TEXTS), 0)  # copied from memory, not computed
    assert all(k in disk for k in copy.keys)
    shared = engine.attach_store("dict://late")  # attached after warming: the next warm copies into it
    late = engine.kv.warmer.run(engine.kv.warmer.prepare(TEXTS), engine.kv.stores)
    assert (late.computed, late.copied) == (0, len(TEXTS)) and set(shared.records) == set(late.keys)


def test_a_local_tier_is_read_before_a_shared_one_whatever_the_attach_order(make_engine, tmp_path, dict_scheme):
    engine = make_engine("llama")
    engine.warm(TEXTS, store_dir="dict://kv")
    engine.warm(TEXTS, store_dir=tmp_path)
    assert [t.shared for t in engine.kv.stores.attached] == [False, True]
    reader = make_engine("llama")
    reader.attach_store("dict://kv")
    reader.attach_store(tmp_path)
    shared = dict_scheme["dict://kv"]
    asked = shared.asked
    reader.prefill(chunks=TEXTS, query="Which ships?")
    assert shared.asked == asked  # the folder held every chunk: the server was not asked
