"""The Redis tier against a real redis-server on 127.0.0.1 (started here, stopped at the end):
shared by processes, pipelined, checksummed, and a down, slow or full server is one warning."""

import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
from store_faults import DAMAGES, damage
from tiny_models import tiny_model

from cacheblend import BlendConfig, BlendEngine, ChunkRecord, StoreWarning
from cacheblend.stores.redis import RedisStore
from cacheblend.tools.local_redis import RedisServer


FP = "e" * 64
HERE = Path(__file__).resolve().parent
TEXTS = [f"Passage {i} tells of the lighthouse keeper and the ship named Aurora {i}." for i in range(4)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield srv
    srv.stop()


@pytest.fixture
def fresh(server):
    """The shared server, emptied."""
    import redis

    redis.Redis.from_url(server.url).flushall()
    return server


def record(key: str, tokens: int = 40, text: str = "a text") -> ChunkRecord:
    return ChunkRecord(key, torch.randn(4, 2, 2, tokens, 16).half(), text)


@pytest.mark.parametrize("via", ["tcp", "unix"])
def test_round_trip_is_bitwise_and_pipelined(fresh, via):
    store = RedisStore(fresh.url if via == "tcp" else fresh.unix_url, FP, ttl_s=3600)
    recs = [record(f"{i:02d}" * 32, text=f"text {i}") for i in range(3)]
    store.put_many(recs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = store.get_many([recs[2].key, "ff" * 32, recs[0].key])
        assert torch.equal(back[0].kv, recs[2].kv) and back[1] is None and back[0].text == "text 2"
        assert torch.equal(back[2].kv, recs[0].kv)
        assert store.contains_many([recs[1].key, "ff" * 32]) == [True, False]
        assert sorted(RedisStore(fresh.url, FP).texts()) == ["text 0", "text 1", "text 2"]
        assert RedisStore(fresh.url, "0" * 64).get(recs[0].key) is None  # another model's namespace
    import redis

    ttl = redis.Redis.from_url(fresh.url).pttl(store._kv(recs[0].key))
    assert 0 < ttl <= 3600 * 1000


@pytest.mark.parametrize("how", [*DAMAGES, "wrong type"])
def test_damaged_value_is_a_miss_and_is_deleted(fresh, how):
    import redis

    client = redis.Redis.from_url(fresh.url)
    store = RedisStore(fresh.url, FP)
    rec = record("ab" * 32)
    store.put(rec)
    name = store._kv(rec.key)
    if how == "wrong type":  # something else stored under our key
        client.delete(name)
        client.rpush(name, b"x")
    else:
        client.set(name, damage(client.get(name), how, FP, rec.key))
    with pytest.warns(StoreWarning, match="bad KV value"):
        assert store.get(rec.key) is None
    assert not client.exists(name) and store.available
    store.put(rec)
    assert torch.equal(store.get(rec.key).kv, rec.kv)


_WRITER = """
import sys, torch
sys.path.insert(0, {tests!r})
from cacheblend import ChunkRecord
from cacheblend.stores.redis import RedisStore
store = RedisStore({url!r}, {fp!r})
for round_ in range(5):
    store.put_many([ChunkRecord(f"{{i:02d}}" * 32, torch.full((4, 2, 2, 30, 16), float(i)), f"text {{i}}") for i in range(20)])
"""


def test_two_writers_at_once_leave_every_value_whole(fresh):
    script = _WRITER.format(tests=str(HERE.parent), url=fresh.url, fp=FP)
    procs = [subprocess.Popen([sys.executable, "-c", script]) for _ in range(2)]
    assert [p.wait(120) for p in procs] == [0, 0]
    store = RedisStore(fresh.url, FP)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = store.get_many([f"{i:02d}" * 32 for i in range(20)])
    assert all(torch.equal(r.kv, torch.full((4, 2, 2, 30, 16), float(i))) for i, r in enumerate(got))
    assert sorted(store.texts()) == sorted(f"text {i}" for i in range(20))


_WARMER = """
import sys
sys.path.insert(0, {tests!r})
from tiny_models import tiny_model
from transformers import AutoTokenizer
from cacheblend import BlendConfig, BlendEngine
engine = BlendEngine(tiny_model("llama"), AutoTokenizer.from_pretrained({tok!r}), config=BlendConfig(kv_dtype="float32", neighbours=0))
engine.warm({texts!r}, store_dir={url!r})
"""


def prompt_of(engine, texts):
    return engine.render_chat([{"role": "user", "content": "\n\n".join(texts) + "\n\nWho keeps the lighthouse?"}])


def test_a_second_process_answers_from_the_shared_server_without_warming(fresh, make_engine, bundled_dir):
    script = _WARMER.format(tests=str(HERE.parent), tok=str(bundled_dir), texts=TEXTS, url=fresh.url)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    engine = make_engine()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine.attach_store(fresh.url)  # learns the chunk texts from the server
        assert len(engine.kv.stores.memory) == 0
        pre = engine.prefill(prompt_of(engine, TEXTS), recompute_ratio=0.15)
    assert pre.stats.chunk_hits == len(TEXTS) and pre.stats.chunk_misses == 0
    local = make_engine()
    local.warm(TEXTS)  # the same chunks computed here: the shared KV is bitwise the same
    for key in engine.kv.keys(TEXTS):
        assert torch.equal(engine.kv.stores.memory.get(key).kv, local.kv.stores.memory.get(key).kv)
    here = local.prefill(prompt_of(local, TEXTS), recompute_ratio=0.15)
    assert torch.equal(pre.output.logits, here.output.logits)


def _prefill_stream(engine, prompt, killed: threading.Event, results: list, errors: list, after: int = 3) -> None:
    """Prefills (each reads the Redis tier: the engine keeps no memory tier) and writes one record
    each, until ``after`` prefills have begun after ``killed`` was set; any exception is kept."""
    try:
        while sum(began_after for began_after, _ in results) < after and len(results) < 1000:
            began_after = killed.is_set()
            pre = engine.prefill(prompt, recompute_ratio=0.0)
            engine.kv.stores.shared[0].put_many([record(f"{len(results):064x}")])  # a write mid-stream too
            results.append((began_after, pre))
    except BaseException as exc:  # noqa: BLE001 - the main thread asserts there was none
        errors.append(exc)


def test_server_killed_mid_use_then_restarted_empty(tmp_path, make_engine, tokenizer):
    srv = RedisServer(tmp_path / "redis").start()
    try:
        make_engine().warm(TEXTS, store_dir=srv.url)
        config = BlendConfig(kv_dtype="float32", neighbours=0)
        engine = BlendEngine(tiny_model("llama"), tokenizer, config=config, memory_bytes=1)  # keeps no record
        remote = engine.attach_store(srv.url)
        remote.retry_after_s = 5.0
        prompt = prompt_of(engine, TEXTS)
        local = make_engine()
        local.warm(TEXTS)
        hit = local.prefill(prompt, recompute_ratio=0.0).output.logits  # what a read of the server gives
        miss = make_engine().prefill(prompt, recompute_ratio=0.0).output.logits  # no store at all
        full = make_engine().prefill(prompt, recompute_ratio=1.0).output.logits
        torch.testing.assert_close(miss, full, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(hit, miss, atol=1e-3)  # the two outcomes are told apart

        killed, results, errors = threading.Event(), [], []
        stream = threading.Thread(target=_prefill_stream, args=(engine, prompt, killed, results, errors))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            stream.start()
            deadline = time.monotonic() + 60
            while len(results) < 2 and stream.is_alive() and time.monotonic() < deadline:
                time.sleep(0.001)
            srv.kill()  # the stream is mid-way: between, or inside, a read, a forward pass, a write
            killed.set()
            stream.join(120)
        assert not stream.is_alive() and not errors, errors
        outages = [w for w in caught if issubclass(w.category, StoreWarning)]
        assert len(outages) == 1 and "Redis" in str(outages[0].message)  # one warning for the outage
        n = len(TEXTS)
        for began_after, pre in results:  # each prefill read the server whole, or not at all
            if (pre.stats.chunk_hits, pre.stats.chunk_misses) == (n, 0):
                assert not began_after and torch.equal(pre.output.logits, hit)
            else:
                assert (pre.stats.chunk_hits, pre.stats.chunk_misses) == (0, n)
                # recomputed: the no-store answer (its head read from the engine's head cache: fp32 order)
                torch.testing.assert_close(pre.output.logits, miss, atol=1e-5, rtol=1e-5)
        assert [pre.stats.chunk_hits for _, pre in results[:2]] == [n, n]
        assert sum(began_after for began_after, _ in results) == 3

        srv.start()  # same port, empty
        deadline = time.monotonic() + 60
        while not remote.available and time.monotonic() < deadline:  # the breaker closes after retry_after_s
            time.sleep(0.05)
        assert remote.available
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert engine.prefill(prompt, recompute_ratio=0.0).stats.chunk_misses == n
            engine.warm(TEXTS)  # writes every chunk the server lacks through to it
        reader = make_engine()
        reader.attach_store(srv.url)
        assert reader.prefill(prompt, recompute_ratio=0.0).stats.chunk_hits == n
    finally:
        srv.stop()


def test_slow_server_is_a_miss_after_the_timeout(fresh):
    import redis

    store = RedisStore(fresh.url, FP, timeout_s=0.2, retry_after_s=60)
    rec = record("cd" * 32)
    store.put(rec)
    sleeper = threading.Thread(target=lambda: redis.Redis.from_url(fresh.url).execute_command("DEBUG", "SLEEP", 1.0))
    sleeper.start()
    time.sleep(0.1)
    try:
        with pytest.warns(StoreWarning, match="TimeoutError") as caught:
            assert store.get(rec.key) is None
            assert store.get(rec.key) is None and store.texts() == []
        assert len(caught) == 1
    finally:
        sleeper.join()


def test_full_server_is_one_warning_and_no_exception(tmp_path):
    srv = RedisServer(tmp_path / "redis", maxmemory="1mb", **{"maxmemory-policy": "noeviction"}).start()
    try:
        store = RedisStore(srv.url, FP)
        with pytest.warns(StoreWarning, match="OutOfMemoryError|OOM") as caught:
            for i in range(4):
                store.put(record(f"{i:02d}" * 32, tokens=2000))  # 1 MiB each
        assert len(caught) == 1
    finally:
        srv.stop()


def test_texts_come_from_the_records_so_an_lfu_eviction_hides_none(tmp_path):
    """A server under maxmemory + allkeys-lfu evicts records; a fresh store's texts() (read from
    the records' own headers, no separate catalogue) names exactly the records still readable."""
    import redis

    srv = RedisServer(tmp_path / "redis", maxmemory="4mb", **{"maxmemory-policy": "allkeys-lfu"}).start()
    try:
        admin = redis.Redis.from_url(srv.url)
        store = RedisStore(srv.url, FP)
        hot = [record(f"{i:064x}", tokens=400, text=f"hot {i}") for i in range(4)]  # ~200 KiB each
        store.put_many(hot)
        for _ in range(200):
            store.get_many([r.key for r in hot])  # the server's LFU counters learn they are hot
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for i in range(60):  # one-off records: 12 MiB written into 4 MiB
                store.put(record(f"{1000 + i:064x}", tokens=400, text=f"once {i}"))
            evicted = admin.info("stats")["evicted_keys"]
            admin.config_set("maxmemory", "256mb")  # headroom: reading below evicts nothing more
            named = set(RedisStore(srv.url, FP).texts())
            reader = RedisStore(srv.url, FP)
            texts = {r.text for r in hot} | {f"once {i}" for i in range(60)}
            keys = {r.text: r.key for r in hot} | {f"once {i}": f"{1000 + i:064x}" for i in range(60)}
            readable = {t for t in texts if reader.get(keys[t]) is not None}
        assert evicted > 20 and 0 < len(readable) < len(texts), (evicted, len(readable))
        print(f"LFU test: {evicted} evicted, {len(readable)} of {len(texts)} readable, {len(named)} named")
        assert named == readable  # every readable record named; nothing named that is gone
        assert admin.info("stats")["evicted_keys"] == evicted
        assert {r.text for r in hot} <= readable, sorted(readable)  # LFU kept the hot set
        assert not admin.exists(f"cacheblend:{FP[:16]}:texts")  # no separate catalogue to lose
    finally:
        srv.stop()


def test_texts_read_long_headers_and_leave_out_what_is_not_a_whole_record(fresh):
    import redis

    client = redis.Redis.from_url(fresh.url)
    store = RedisStore(fresh.url, FP)
    long_text = "A long passage ✓ " * 700  # a header of ~12 KB: past the first GETRANGE
    recs = [record("aa" * 32, text=long_text), record("bb" * 32, text="short"), record("cc" * 32, text="torn")]
    store.put_many(recs)
    name = store._kv("cc" * 32)
    client.set(name, client.get(name)[:-10])  # cut short: a miss when read, so not named
    client.set(store._kv("dd" * 32), b"\xff" * 8 + b"garbage")  # a header length no record has
    client.rpush(store._kv("ee" * 32), b"x")  # something else under our prefix
    assert sorted(RedisStore(fresh.url, FP).texts()) == sorted([long_text, "short"]) and store.available


def test_cluster_url_reaches_a_real_cluster_node(tmp_path):
    import redis

    srv = RedisServer(tmp_path / "redis", **{"cluster-enabled": "yes", "cluster-config-file": "nodes.conf"}).start()
    try:
        admin = redis.Redis.from_url(srv.url)
        admin.execute_command("CLUSTER", "ADDSLOTS", *range(16384))
        deadline = time.monotonic() + 10
        while b"cluster_state:ok" not in admin.execute_command("CLUSTER", "INFO") and time.monotonic() < deadline:
            time.sleep(0.05)
        store = RedisStore(f"redis+cluster://127.0.0.1:{srv.port}", FP)
        recs = [record(f"{i:02d}" * 32, text=f"t{i}") for i in range(5)]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            store.put_many(recs)
            back = store.get_many([r.key for r in recs])
            assert all(torch.equal(a.kv, b.kv) for a, b in zip(back, recs))
            assert sorted(store.texts()) == [f"t{i}" for i in range(5)]
    finally:
        srv.stop()


def test_bad_urls_and_settings_raise_value_error():
    for bad in ("http://x", "", "/a/folder"):
        with pytest.raises(ValueError, match="Redis URL"):
            RedisStore(bad, FP)
    with pytest.raises(ValueError, match="ttl_s"):
        RedisStore("redis://127.0.0.1:1", FP, ttl_s=0)


def test_url_options_set_ttl_timeout_and_breaker(fresh):
    store = RedisStore.from_url(fresh.url + "?ttl=60&timeout=0.25&retry_after=2", FP)
    assert (store.ttl_s, store.timeout_s, store.retry_after_s) == (60.0, 0.25, 2.0) and "?" not in store.url
    store.put(record("aa" * 32))
    import redis

    assert 0 < redis.Redis.from_url(fresh.url).pttl(store._kv("aa" * 32)) <= 60_000
    with pytest.raises(ValueError, match="ttl"):
        RedisStore.from_url(fresh.url + "?ttl=0", FP)
    with pytest.raises(ValueError, match="bad option"):
        RedisStore.from_url(fresh.url + "?timeout=soon", FP)
