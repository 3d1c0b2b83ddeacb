"""Records never lie: checksums, quarantine and rewrite, dead writers' temp files, a catalogue that
never loses a stored chunk, a read-only store read by a non-root user, kill -9 while warming."""

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest
import torch

from cacheblend import ChunkRecord, DiskStore, StoreWarning
from cacheblend.stores import integrity
from store_faults import DAMAGES, FORKING_WARMER, KILL_POINTS, damage

FP = "f" * 64
HERE = Path(__file__).resolve().parent


def record(key: str, tokens: int = 40, text: str = "some text") -> ChunkRecord:
    return ChunkRecord(key, torch.randn(4, 2, 2, tokens, 16).half(), text)


KEY = "ab" * 32


@pytest.mark.parametrize("how", DAMAGES)
def test_damaged_disk_record_is_a_miss_is_quarantined_and_rewritten(tmp_path, how):
    store = DiskStore(tmp_path, FP)
    rec = record(KEY)
    store.put(rec)
    path = store.path(KEY)
    path.write_bytes(damage(path.read_bytes(), how, FP, KEY))
    assert (KEY in store) is (how == "inf")  # the header check sees a cut or foreign file at once
    with pytest.warns(StoreWarning, match="another model" if how == "foreign" else "unreadable"):
        assert store.get(KEY) is None
    assert not path.exists() and (store.dir / "quarantine" / path.name).is_file()
    assert KEY not in store  # so warm writes it again
    store.put(rec)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(store.get(KEY).kv, rec.kv)


def test_record_checksum_covers_every_tensor_byte():
    data = integrity.encode(record(KEY, tokens=3), FP)
    start = integrity.parse_header(data, FP, KEY)[1]
    for i in range(start, len(data), 7):  # flip one bit at a time, anywhere in the data section
        flipped = bytearray(data)
        flipped[i] ^= 0x10
        with pytest.raises(integrity.RecordError, match="checksum"):
            integrity.decode(bytes(flipped), FP, KEY)


def test_record_of_an_older_version_without_checksum_is_refused(tmp_path):
    from safetensors.torch import save

    meta = {"fingerprint": FP, "layout": "1", "key": KEY, "text": "t"}
    store = DiskStore(tmp_path, FP)
    store.path(KEY).parent.mkdir(parents=True)
    store.path(KEY).write_bytes(save({"kv": record(KEY).kv}, metadata=meta))
    assert KEY not in store
    with pytest.warns(StoreWarning, match="no checksum"):
        assert store.get(KEY) is None


def test_corrupt_record_is_recomputed_then_rewritten_by_the_next_warm(make_engine, tmp_path):
    texts = [f"Passage number {i} says something about the river and the mill." for i in range(3)]
    make_engine().warm(texts, store_dir=tmp_path)
    engine = make_engine()
    disk = engine.attach_store(tmp_path)
    key = engine.kv.keys(texts[:1])[0]
    path = disk.path(key)
    path.write_bytes(damage(path.read_bytes(), "inf", engine.kv.fingerprint, key))
    with pytest.warns(StoreWarning) as caught:
        pre = engine.prefill(chunks=texts, query="Which river?", recompute_ratio=0.0)
    assert pre.stats.chunk_hits == 2 and pre.stats.chunk_misses == 1 and len(caught) == 1
    fresh = make_engine()
    fresh.attach_store(tmp_path)
    fresh.warm(texts, store_dir=tmp_path)  # rewrites the quarantined record
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(DiskStore(tmp_path, engine.kv.fingerprint).get(key).kv, fresh.kv.stores.get(key).kv)


def test_temp_files_of_dead_writers_are_removed_at_open(tmp_path):
    store = DiskStore(tmp_path, FP)
    store.put(record(KEY))
    tmp = store.dir / "tmp"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = os.uname().nodename
    mine = tmp / f"{host}-{os.getpid()}-live.part"  # a live writer's: kept
    gone = tmp / f"{host}-{int(dead.stdout)}-dead.part"  # its writer is dead: removed
    young = tmp / "otherhost-1-young.part"  # another host's, recent: kept
    old = tmp / "otherhost-1-old.part"  # another host's, over an hour old: removed
    for p in (mine, gone, young, old):
        p.write_bytes(b"partial")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    DiskStore(tmp_path, FP)
    assert sorted(p.name for p in tmp.iterdir()) == sorted([mine.name, young.name])


@pytest.mark.parametrize("loss", ["deleted", "torn", "old_format"])
def test_catalogue_is_rebuilt_from_record_headers(tmp_path, loss):
    store = DiskStore(tmp_path, FP)
    for i in range(4):
        store.put(record(f"{i:02d}" * 32, text=f"text {i}"))
    cat = store.dir / "catalogue.jsonl"
    lines = cat.read_text().splitlines()
    if loss == "deleted":
        cat.unlink()
    elif loss == "torn":  # a writer killed between its rename and its catalogue line
        cat.write_text("\n".join(lines[:2]) + '\n{"key": "03')
    else:  # lines without keys, as older versions wrote them
        cat.write_text("".join('{"text": "text %d"}\n' % i for i in range(4)))
    expected = {f"text {i}" for i in range(4)}
    assert set(DiskStore(tmp_path, FP).texts()) == expected
    reread = DiskStore(tmp_path, FP)
    assert {t for _, t in reread.catalogue.read()} == expected  # repaired on disk, not only in memory
    assert not set(reread._record_keys()) - {k for k, _ in reread.catalogue.read()}


def _read_only_checks(root: str) -> None:
    """In a forked child, as a user who cannot write the store (root drops to uid 65534 first: root
    writes through any mode bits): reads work, writes warn once, a bad record stays a miss."""
    if os.geteuid() == 0:
        os.setgid(65534)
        os.setuid(65534)
    assert os.geteuid() != 0 and not os.access(root, os.W_OK)
    torch.manual_seed(0)
    good = record("aa" * 32)
    store = DiskStore(root, FP)
    assert torch.equal(store.get(good.key).kv, good.kv) and set(store.texts()) == {"some text"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store.put(record("cc" * 32))
        store.put(record("dd" * 32))
        assert store.get("bb" * 32) is None  # corrupt and cannot be quarantined: still a miss
    messages = [str(w.message) for w in caught]
    assert sum("cannot write" in m for m in messages) == 1 and sum("unreadable" in m for m in messages) == 1
    assert store.get("cc" * 32) is None and Path(store.path("bb" * 32)).exists()


def _make_read_only(root: Path) -> None:
    """Write bits off everywhere (what a plain user's read-only store is; root ignores them)."""
    for p in [root, *root.rglob("*")]:
        p.chmod(p.stat().st_mode & ~0o222)


def test_read_only_store_as_a_non_root_user():
    root = tempfile.mkdtemp(prefix="cb-ro-")  # not under tmp_path: uid 65534 must reach it
    try:
        os.chmod(root, 0o755)
        torch.manual_seed(0)
        store = DiskStore(root, FP)
        store.put(record("aa" * 32))
        store.put(record("bb" * 32))
        bad = store.path("bb" * 32)
        bad.write_bytes(damage(bad.read_bytes(), "inf", FP, "bb" * 32))
        if os.geteuid() != 0:
            _make_read_only(Path(root))
        proc = mp.get_context("fork").Process(target=_read_only_checks, args=(root,))
        proc.start()
        proc.join(60)
        assert proc.exitcode == 0, "the read-only checks failed in the child (its traceback is above)"
    finally:
        for p in [Path(root), *Path(root).rglob("*")]:
            p.chmod(p.stat().st_mode | 0o200)
        subprocess.run(["rm", "-rf", root], check=True)


ROUNDS, PER_ROUND = 100, 16


def _round_texts(round_: int) -> list[str]:
    words = [" ".join(f"word{(i * 7 + j) % 97}" for j in range(40)) for i in range(PER_ROUND)]
    return [f"Round {round_} record {i}: {w}" for i, w in enumerate(words)]


def _kill_one_writer(proc, disk, engine, round_: int, rng) -> str:
    """Round ``round_``: a forked child warms fresh texts; after 0-3 of its records it is killed
    with SIGKILL, 0-10 ms later or stopped at a kill point. Returns where it was killed."""
    point, after = KILL_POINTS[round_ % len(KILL_POINTS)], (round_ // len(KILL_POINTS)) % 4
    texts = _round_texts(round_)
    proc.stdin.write(json.dumps({"texts": texts, "point": point, "after": after}) + "\n")
    proc.stdin.flush()
    lines = [proc.stdout.readline() for _ in range(1 if point == "anywhere" else 2)]  # pid and "paused", any order
    pid = int(next(line for line in lines if line.strip().isdigit()))
    if point == "anywhere":
        paths, deadline = [disk.path(k) for k in engine.kv.keys(texts)], time.monotonic() + 60
        while sum(p.exists() for p in paths) < after and time.monotonic() < deadline:
            time.sleep(0.0005)
        time.sleep(rng.uniform(0, 0.01))
    else:
        assert f"paused {point}\n" in lines, f"round {round_}: the child never reached {point}: {lines}"
    os.kill(pid, signal.SIGKILL)
    status = int(proc.stdout.readline())
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"round {round_} ended with {status}"
    if point in ("write", "rename"):  # its temp file is there (until the next writer opens the store)
        (temp,) = (disk.dir / "tmp").glob(f"*-{pid}-*.part")
        whole = [k for k in engine.kv.keys(texts) if _decodes(temp.read_bytes(), engine.kv.fingerprint, k)]
        assert len(whole) == (point == "rename")  # half a record, or a whole one not renamed...
        assert not any(disk.path(k).exists() for k in whole)  # ...that no reader can see
    return point


def _decodes(data: bytes, fingerprint: str, key: str) -> bool:
    try:
        integrity.decode(data, fingerprint, key)
        return True
    except integrity.RecordError:
        return False


def test_kill_9_while_warming_leaves_only_true_records(make_engine, bundled_dir, tmp_path):
    """100 warming writers killed with SIGKILL, a quarter each anywhere and at each kill point of a
    record write (half its bytes written, whole but not renamed, renamed with half its catalogue
    line): every record file left is whole and what a fresh computation gives (fp32 round-off), the
    catalogue names every one, no temp file survives the next open. Writers fork from one process
    that has the engine loaded, so a round takes milliseconds."""
    import random

    store, engine = tmp_path / "kv", make_engine()
    disk = DiskStore(store, engine.kv.fingerprint)
    script = FORKING_WARMER.format(tests=str(HERE.parent), tok=str(bundled_dir), store=str(store))
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        rng = random.Random(0)
        points = [_kill_one_writer(proc, disk, engine, r, rng) for r in range(ROUNDS)]
    finally:
        proc.stdin.close()
        proc.wait(30)
    assert sorted(set(points)) == sorted(KILL_POINTS)
    disk = DiskStore(store, engine.kv.fingerprint)  # opening cleans the dead writers' temp files
    assert not list((disk.dir / "tmp").glob("*.part"))
    stored = disk._record_keys()
    everything = [t for r in range(ROUNDS) for t in _round_texts(r)]
    assert 0 < len(stored) < len(everything) / 2, "each round must be killed part-way through"
    by_key = dict(zip(engine.kv.keys(everything), everything))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the writers ran: another thread count sums in another order
    try:
        engine.warm([by_key[k] for k in stored], batch_size=8, progress=False)  # a fresh computation, in memory
    finally:
        torch.set_num_threads(threads)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a torn or corrupt record would be a StoreWarning: none is
        for key in stored:
            # The writers batched other texts together (other padding widths, other kernel blocking),
            # so the values agree to fp32 round-off, not bit for bit; a torn record (half its bytes,
            # another record's bytes) would be off by whole units or fail its checksum.
            torch.testing.assert_close(disk.get(key).kv, engine.kv.stores.memory.get(key).kv, atol=1e-5, rtol=1e-5,
                                       msg=lambda m: f"{key}: {m}")
        assert {disk.get(k).text for k in stored} <= set(disk.texts())
