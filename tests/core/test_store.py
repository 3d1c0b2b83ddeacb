"""Stores: bitwise round trips, LRU budgets, and every failure is a miss with a warning."""

import json
import multiprocessing as mp
import os

import pytest
import torch

from cacheblend import ChunkRecord, DiskStore, MemoryStore, StoreChain, StoreWarning
from cacheblend.stores.keys import chunk_key

FP = "f" * 64


def record(key: str, tokens: int = 5, dtype=torch.float16, text="some text") -> ChunkRecord:
    return ChunkRecord(key, torch.randn(4, 2, 2, tokens, 16).to(dtype), text)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_disk_round_trip_is_bitwise_equal(tmp_path, dtype):
    store = DiskStore(tmp_path, FP)
    rec = record("ab" * 32, dtype=dtype, text="unicodé ✓ text\nwith lines")
    store.put(rec)
    back = DiskStore(tmp_path, FP).get(rec.key)  # a fresh store object: nothing cached in memory
    assert back.kv.dtype == dtype and torch.equal(back.kv.view(torch.uint8), rec.kv.view(torch.uint8))
    assert back.text == rec.text and rec.key in store
    assert list(DiskStore(tmp_path, FP).texts()) == [rec.text]


def test_fingerprint_mismatch_is_a_miss_with_a_warning(tmp_path):
    rec = record("cd" * 32)
    DiskStore(tmp_path, FP).put(rec)
    other = DiskStore(tmp_path, "0" * 64)
    assert other.get(rec.key) is None  # another model's folder: plain miss
    # The same file copied under another fingerprint's folder is refused by its header.
    os.makedirs(other.path(rec.key).parent)
    os.replace(DiskStore(tmp_path, FP).path(rec.key), other.path(rec.key))
    with pytest.warns(StoreWarning, match="another model"):
        assert other.get(rec.key) is None


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_torn_or_corrupt_file_is_a_miss_with_a_warning(tmp_path, damage):
    store = DiskStore(tmp_path, FP)
    rec = record("ef" * 32, tokens=50)
    store.put(rec)
    path = store.path(rec.key)
    data = path.read_bytes()
    path.write_bytes({"truncate": data[: len(data) // 2], "garbage": b"\x07" * 100, "empty": b""}[damage])
    with pytest.warns(StoreWarning, match="unreadable"):
        assert store.get(rec.key) is None


def test_put_leaves_no_temporary_files(tmp_path):
    store = DiskStore(tmp_path, FP)
    for i in range(3):
        store.put(record(f"{i:02d}" * 32))
    files = [p.name for p in tmp_path.rglob("*") if p.is_file()]
    assert not [f for f in files if f.startswith(".tmp")] and len(files) == 4  # 3 chunks + catalogue


def test_unwritable_store_degrades_to_memory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the store's folder should be")
    _check_unwritable(blocker)


def _check_unwritable(root):
    chain = StoreChain(MemoryStore())
    disk = chain.attach(DiskStore(root, FP))
    rec = record("aa" * 32)
    chain.memory.put(rec)
    with pytest.warns(StoreWarning, match="cannot write"):
        disk.put(rec)
    disk.put(record("bb" * 32))  # later writes are skipped quietly
    assert chain.get(rec.key) is rec and disk.get(rec.key) is None


def _write_past_a_size_limit(root: str) -> None:
    """In a child process whose files may not grow past 64 KiB (what a full disk looks like to a
    writer: the write fails part-way with an OSError), store a small record, then a large one."""
    import resource
    import signal
    import warnings

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG from write() instead of a signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    torch.manual_seed(0)
    store = DiskStore(root, FP)
    store.put(record("aa" * 32))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store.put(record("bb" * 32, tokens=400, dtype=torch.float32))  # ~200 KiB: fails mid-write
    assert any("cannot write" in str(w.message) for w in caught), [str(w.message) for w in caught]


def test_a_full_disk_leaves_no_partial_file_and_keeps_earlier_records(tmp_path):
    proc = mp.get_context("spawn").Process(target=_write_past_a_size_limit, args=(str(tmp_path),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    torch.manual_seed(0)
    small = record("aa" * 32)
    store = DiskStore(tmp_path, FP)
    files = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert files == ["aa" * 32 + ".safetensors", "catalogue.jsonl"]  # no temp file, no torn file
    assert torch.equal(store.get(small.key).kv, small.kv) and store.get("bb" * 32) is None


def test_memory_store_evicts_least_recently_used_within_budget():
    one = record("11" * 32).nbytes
    store = MemoryStore(max_bytes=2 * one)
    a, b, c = record("a" * 64), record("b" * 64), record("c" * 64)
    store.put(a)
    store.put(b)
    assert store.get(a.key) is a  # a is now the most recent
    store.put(c)
    assert b.key not in store and a.key in store and c.key in store and store.nbytes == 2 * one
    huge = MemoryStore(max_bytes=one // 2)
    huge.put(a)
    assert a.key not in huge


def test_chain_promotes_disk_hits_into_memory(tmp_path):
    rec = record("dd" * 32)
    DiskStore(tmp_path, FP).put(rec)
    chain = StoreChain(MemoryStore())
    chain.attach(DiskStore(tmp_path, FP))
    chain.attach(DiskStore(tmp_path, FP))  # attaching twice is a no-op
    assert len(chain.attached) == 1 and rec.key not in chain.memory
    assert torch.equal(chain.get(rec.key).kv, rec.kv) and rec.key in chain.memory


def test_chunk_keys_depend_on_fingerprint_and_tokens_only():
    k = chunk_key(FP, [1, 2, 3])
    assert k == chunk_key(FP, [1, 2, 3]) and len(k) == 64
    assert k != chunk_key(FP, [3, 2, 1]) and k != chunk_key("0" * 64, [1, 2, 3])


def _writer(root, seed):
    torch.manual_seed(seed)
    store = DiskStore(root, FP)
    for i in range(20):
        store.put(ChunkRecord(f"{i:02d}" * 32, torch.full((4, 2, 2, 30, 16), float(i)), f"text {i}"))


def test_two_processes_writing_one_store_leave_every_file_whole(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), s)) for s in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    store = DiskStore(tmp_path, FP)
    for i in range(20):
        assert torch.equal(store.get(f"{i:02d}" * 32).kv, torch.full((4, 2, 2, 30, 16), float(i)))
    lines = (store.dir / "catalogue.jsonl").read_text().splitlines()
    assert len(lines) == 40 and {json.loads(x)["text"] for x in lines} == {f"text {i}" for i in range(20)}


def test_torn_catalogue_line_is_skipped(tmp_path):
    store = DiskStore(tmp_path, FP)
    store.put(record("ee" * 32, text="whole"))
    with open(store.dir / "catalogue.jsonl", "a") as f:
        f.write('{"text": "torn')
    assert list(store.texts()) == ["whole"]


def test_store_of_another_model_warns_on_attach_and_misses(make_engine, tmp_path):
    writer = make_engine("llama")
    text = "A passage warmed by one model and read by another."
    writer.warm([text], store_dir=tmp_path)
    reader = make_engine("qwen3")
    with pytest.warns(StoreWarning, match="other models"):
        reader.attach_store(tmp_path)
    assert DiskStore.fingerprints(tmp_path) == [writer.kv.fingerprint[:16]]
    pre = reader.prefill(chunks=[text], query="q", recompute_ratio=0.0)
    assert pre.stats.chunk_hits == 0 and not reader.kv.is_warm(text) and writer.kv.is_warm(text)
