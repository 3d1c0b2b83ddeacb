"""The bounded tiers' policy (stores/policy.py): recency and popularity, measured against plain LRU
and the static optimum on a Zipf-skewed retrieval trace; admission; bounded bookkeeping; the disk
tier's byte budget."""

import multiprocessing as mp
import os
import time
import warnings
from collections import OrderedDict

import numpy as np
import pytest
import torch

from cacheblend import ChunkRecord, DiskStore, MemoryStore
from cacheblend.stores import open_tier
from cacheblend.stores.policy import Policy

KEYS, LOOKUPS, PER_QUERY, BUDGET, ZIPF = 2000, 20_000, 6, 200, 1.1
KV = torch.zeros(1)  # 4 bytes: every record the same size, so the budget is BUDGET records


def zipf_trace(seed: int) -> list[list[str]]:
    """Queries of PER_QUERY distinct keys (a retriever's top-k), drawn Zipf(1.1) over KEYS keys
    whose popularity ranks are shuffled; LOOKUPS key lookups in all."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, KEYS + 1) ** ZIPF
    p /= p.sum()
    names = [f"{i:064x}" for i in rng.permutation(KEYS)]
    return [[names[i] for i in rng.choice(KEYS, PER_QUERY, replace=False, p=p)] for _ in range(LOOKUPS // PER_QUERY)]


class LRU:
    """Plain least-recently-used, what the memory tier was."""

    def __init__(self, n: int) -> None:
        self.n, self.keys = n, OrderedDict()

    def get_many(self, keys):
        out = []
        for k in keys:
            out.append(k in self.keys)
            if k in self.keys:
                self.keys.move_to_end(k)
        return out

    def put(self, key: str) -> None:
        self.keys[key] = None
        if len(self.keys) > self.n:
            self.keys.popitem(last=False)


def second_half_hit_rate(trace, lookup, put) -> float:
    """Put-after-miss over the whole trace; the hit rate of the second half's lookups."""
    hits = total = 0
    for q, keys in enumerate(trace):
        found = lookup(keys)
        for key, hit in zip(keys, found):
            if not hit:
                put(key)
        if q >= len(trace) // 2:
            hits, total = hits + sum(found), total + len(keys)
    return hits / total


def measure(seed: int) -> tuple[float, float, float]:
    trace = zipf_trace(seed)
    memory = MemoryStore(max_bytes=BUDGET * KV.numel() * KV.element_size())
    ours = second_half_hit_rate(
        trace, lambda ks: [r is not None for r in memory.get_many(ks)], lambda k: memory.put(ChunkRecord(k, KV, k))
    )
    lru = LRU(BUDGET)
    plain = second_half_hit_rate(trace, lru.get_many, lru.put)
    counts: dict[str, int] = {}
    for keys in trace:
        for k in keys:
            counts[k] = counts.get(k, 0) + 1
    best = set(sorted(counts, key=counts.get, reverse=True)[:BUDGET])  # held from the start
    optimum = second_half_hit_rate(trace, lambda ks: [k in best for k in ks], lambda k: None)
    assert len(memory) <= BUDGET and memory.nbytes <= memory.max_bytes
    return ours, plain, optimum


@pytest.mark.parametrize("seed", [0, 1])
def test_policy_beats_lru_and_nears_the_static_optimum_on_a_zipf_trace(seed):
    ours, lru, optimum = measure(seed)
    said = f"policy {ours:.4f}, LRU {lru:.4f}, static optimum {optimum:.4f} (ratio {ours / optimum:.3f})"
    assert ours >= 0.9 * optimum, said
    assert ours > lru, said
    print(said)


def test_a_one_off_chunk_does_not_evict_a_hot_one():
    one = KV.numel() * KV.element_size()
    store = MemoryStore(max_bytes=2 * one)
    hot = [ChunkRecord(k, KV, k) for k in ("a" * 64, "b" * 64)]
    for rec in hot:
        store.get(rec.key)  # a miss, counted
        store.put(rec)
    for _ in range(3):
        store.get_many([r.key for r in hot])
    store.get("c" * 64)
    store.put(ChunkRecord("c" * 64, KV, "c"))  # looked up once: less than either stored record
    assert "c" * 64 not in store and all(r.key in store for r in hot)
    assert (store.hits, store.misses, store.evictions, store.rejected) == (6, 3, 0, 1)
    for _ in range(4):
        store.get("c" * 64)  # 5 lookups now, more than "a" and "b" (4 each)
    store.put(ChunkRecord("c" * 64, KV, "c"))  # admitted; evicts "a", the less recent of the two
    assert "c" * 64 in store and "b" * 64 in store and "a" * 64 not in store
    assert (store.evictions, store.rejected, len(store), store.nbytes) == (1, 1, 2, 2 * one)


def test_counts_age_and_the_bookkeeping_stays_bounded():
    policy = Policy(100, max_counters=500, age_every=1000)
    for _ in range(8):
        policy.touch("hot")
    for i in range(20_000):  # one-off keys: never more than the cap counted
        policy.touch(f"k{i}")
        assert len(policy._counts) <= 500 + 1
    assert policy.count("hot") < 8  # halved along the way: old popularity fades
    policy.add("x", 60)
    policy.add("y", 40)
    assert policy.plan("z", 101) is None  # larger than the whole budget
    assert policy.plan("x", 60) == [] and policy.plan("z", 30) == ["x"]  # x: the older of two at count 0


# -- the disk tier's byte budget ---------------------------------------------------------------
FP = "d" * 64


def disk_record(i: int) -> ChunkRecord:
    return ChunkRecord(f"{i:064x}", torch.full((2, 2, 1, 8, 16), float(i)).half(), f"text {i}")


def file_bytes(store) -> int:
    return sum(p.stat().st_size for p in (store.dir / "kv").glob("*/*.safetensors"))


def one_file(tmp_path) -> int:
    probe = DiskStore(tmp_path / "probe", FP)
    probe.put(disk_record(0))
    return file_bytes(probe)


def test_disk_budget_holds_keeps_hot_records_and_hides_none(tmp_path):
    size = one_file(tmp_path)
    store = DiskStore(tmp_path / "kv", FP, max_bytes=10 * size)
    hot = [disk_record(i) for i in range(5)]
    for rec in hot:
        store.get(rec.key)
        store.put(rec)
    for _ in range(3):
        store.get_many([r.key for r in hot])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an evicted record is a plain miss, never a warning
        for i in range(5, 60):  # one-off chunks, each looked up (a miss) once, then put
            assert store.get(disk_record(i).key) is None
            store.put(disk_record(i))
            assert file_bytes(store) <= 10 * size  # never over, even for a moment after a put
        assert all(torch.equal(store.get(r.key).kv, r.kv) for r in hot)  # the hot set survived
        assert store.get(disk_record(5).key) is None  # an early one-off: deleted (its text stays catalogued)
        present = set(store._record_keys())
        assert len(present) == 10 and store.evictions == 50 and store.rejected == 0
        texts = set(store.texts())
        assert {f"text {int(k, 16)}" for k in present} <= texts  # every stored record is named
        (store.dir / "catalogue.jsonl").unlink()  # a lost catalogue: re-built from the records present
        assert set(DiskStore(tmp_path / "kv", FP).texts()) == {f"text {int(k, 16)}" for k in present}


def test_a_bounded_folder_keeps_its_catalogue_bounded_and_it_still_names_every_record(tmp_path):
    """200 one-off chunks through a folder that holds 5: the catalogue (one line per write) is
    compacted to the records present, a line lost to a concurrent compaction is found again from
    its record's header, and a catalogue-less reader sees the same texts."""
    from cacheblend.stores.catalogue import SLACK

    size = one_file(tmp_path)
    store = DiskStore(tmp_path / "kv", FP, max_bytes=5 * size)
    for i in range(200):
        assert store.get(disk_record(i).key) is None
        store.put(disk_record(i))
        present = store._record_keys()
        assert store.catalogue.lines() <= 2 * len(present) + SLACK + 1, i
    named = {f"text {int(k, 16)}" for k in present}
    texts = set(store.texts())
    assert len(present) == 5 and named <= texts and len(texts) <= 2 * 5 + SLACK + 1  # most evicted ones dropped
    # a writer whose line went to the old file while another process compacted: the record stays findable
    store.catalogue.compact(set())  # as if nothing were present: every line dropped
    assert store.catalogue.lines() == 0 and set(DiskStore(tmp_path / "kv", FP).texts()) == named
    assert {k for k, _ in store.catalogue.read()} == present  # re-catalogued from the headers


def test_a_one_off_write_is_refused_when_every_file_is_hotter(tmp_path):
    size = one_file(tmp_path)
    store = DiskStore(tmp_path / "kv", FP, max_bytes=2 * size)
    for i in range(2):
        store.get(disk_record(i).key)
        store.put(disk_record(i))
        store.get(disk_record(i).key)
    store.put(disk_record(9))  # never looked up: refused, nothing deleted
    assert (store.rejected, store.evictions, store.get(disk_record(9).key)) == (1, 0, None)
    assert set(store._record_keys()) == {disk_record(0).key, disk_record(1).key}


def test_open_cuts_an_oversized_folder_oldest_touched_first(tmp_path):
    size = one_file(tmp_path)
    unbounded = DiskStore(tmp_path / "kv", FP)
    now = time.time()
    for i in range(10):
        unbounded.put(disk_record(i))
        os.utime(unbounded.path(disk_record(i).key), (now, now - 1000 + (i * 7919 % 10)))  # shuffled ages
    oldest_first = sorted(range(10), key=lambda i: i * 7919 % 10)
    bounded = DiskStore(tmp_path / "kv", FP, max_bytes=4 * size)
    assert set(bounded._record_keys()) == {disk_record(i).key for i in oldest_first[6:]}
    assert bounded.evictions == 6 and file_bytes(bounded) <= 4 * size
    assert DiskStore(tmp_path / "kv", FP)._record_keys() == bounded._record_keys()  # unbounded: deletes nothing


def _budget_writer(root: str, start: int, max_bytes: int, barrier) -> None:
    store = DiskStore(root, FP, max_bytes=max_bytes)
    barrier.wait(60)  # both write at once
    for i in range(start, start + 200):
        store.get(disk_record(i).key)
        store.put(disk_record(i))


def test_two_processes_sharing_a_budgeted_folder_stay_near_it_and_within_it_after_a_scan(tmp_path):
    size = one_file(tmp_path)
    budget = 16 * size
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_budget_writer, args=(str(tmp_path / "kv"), s, budget, barrier)) for s in (0, 1000)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    store = DiskStore(tmp_path / "kv", FP)
    total = file_bytes(store)
    assert total <= budget + 2 * budget // 8 + 2 * size, f"{total} bytes for a budget of {budget}"
    bounded = DiskStore(tmp_path / "kv", FP, max_bytes=budget)  # its scan at open cuts to the budget
    assert file_bytes(bounded) <= budget
    for key in bounded._record_keys():  # what is left is whole
        assert bounded.get(key) is not None


def test_open_tier_passes_a_folder_budget_and_refuses_one_for_a_server(tmp_path):
    tier = open_tier(tmp_path, FP, max_bytes=1 << 20)
    assert isinstance(tier, DiskStore) and tier.max_bytes == 1 << 20
    with pytest.raises(ValueError, match="allkeys-lfu"):
        open_tier("redis://127.0.0.1:1/0", FP, max_bytes=1 << 20)
