"""The Redis tier on a real 3-node Redis Cluster (three redis-server processes on 127.0.0.1 free
ports, started here and stopped at the end; tools/local_redis.RedisClusterNodes): keys spread
over the nodes, discovery from any node, texts() over every primary, and a node killed mid-use
makes only its slots miss, with one warning per outage."""

import time
import warnings

import pytest
import torch

from cacheblend import ChunkRecord, StoreWarning
from cacheblend.stores.redis import RedisStore
from cacheblend.tools.local_redis import RedisClusterNodes

FP = "c" * 64
N = 60

def records(n: int = N, start: int = 0) -> list[ChunkRecord]:
    return [ChunkRecord(f"{i:064x}", torch.randn(2, 2, 1, 6, 8).half(), f"text {i}") for i in range(start, start + n)]


@pytest.fixture
def cluster(tmp_path, request):
    config = getattr(request, "param", {"cluster-require-full-coverage": "no"})
    nodes = RedisClusterNodes(tmp_path / "cluster", **config).start()
    try:
        yield nodes
    finally:
        nodes.stop()


def admin(cluster, i: int):
    import redis

    return redis.Redis.from_url(cluster.node_url(i))


def holder(cluster, store: RedisStore) -> dict[str, int]:
    """Chunk key -> the node index whose keyspace holds it (asked of each node)."""
    out = {}
    for i in range(3):
        for name in admin(cluster, i).keys(f"{store.prefix}kv:*"):
            out[name.decode()[len(store.prefix) + 3 :]] = i
    return out


def test_records_spread_over_all_three_nodes_and_read_back_from_any(cluster):
    recs = records()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RedisStore(cluster.url, FP).put_many(recs)
        sizes = [admin(cluster, i).dbsize() for i in range(3)]
        assert all(n > 0 for n in sizes) and sum(sizes) == N, sizes  # keys spread over the slots
        via_two = RedisStore(f"redis+cluster://127.0.0.1:{cluster.servers[2].port}", FP)  # discovers the rest
        back = via_two.get_many([r.key for r in recs])
        u8 = torch.uint8
        same = [b is not None and torch.equal(b.kv.view(u8), r.kv.view(u8)) for b, r in zip(back, recs)]
        assert all(same)  # byte-equal
        assert sorted(via_two.texts()) == sorted(r.text for r in recs)  # every primary scanned
        assert via_two.contains_many([recs[0].key, "f" * 64]) == [True, False]


def test_a_plain_client_on_one_node_misses_the_moved_keys_with_one_warning(cluster):
    recs = records()
    RedisStore(cluster.url, FP).put_many(recs)
    plain = RedisStore(cluster.node_url(2), FP)  # no +cluster: answers MOVED for two thirds of the slots
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        back = plain.get_many([r.key for r in recs])
        assert plain.get_many([r.key for r in recs]) == [None] * N  # breaker open: no second warning
    assert back == [None] * N  # never a wrong record, never an exception
    warned = [str(w.message) for w in caught if issubclass(w.category, StoreWarning)]
    assert len(warned) == 1 and "Moved" in warned[0], warned


def test_a_killed_node_makes_only_its_slots_miss_with_one_warning(cluster):
    recs = records()
    store = RedisStore(cluster.url, FP, retry_after_s=60)
    store.put_many(recs)
    where = holder(cluster, store)
    assert len(where) == N
    cluster.kill(1)
    dead = cluster.servers[1].port
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # at once, and again after the server marked node 1 failed
            back = store.get_many([r.key for r in recs])
            for rec, got in zip(recs, back):
                if where[rec.key] == 1:
                    assert got is None
                else:
                    assert got is not None and torch.equal(got.kv, rec.kv)
            assert sorted(store.texts()) == sorted(r.text for r in recs if where[r.key] != 1)
            time.sleep(2.5)  # past cluster-node-timeout (1 s): node 1 is marked failed
        store.put_many(records(30, start=N))  # writes to the live nodes land; node 1's are skipped
    warned = [str(w.message) for w in caught if issubclass(w.category, StoreWarning)]
    assert len(warned) == 1 and f":{dead}" in warned[0], warned  # one warning for the outage
    fresh = records(30, start=N)
    with pytest.warns(StoreWarning, match=f":{dead}"):  # a new process: its own one warning
        landed = [r is not None for r in RedisStore(cluster.url, FP).get_many([r.key for r in fresh])]
    assert 0 < sum(landed) < 30 and store.available


@pytest.mark.parametrize("cluster", [{}], indirect=True)  # the server default: full coverage required
def test_with_full_coverage_required_a_dead_node_stops_every_slot_but_never_raises(cluster):
    recs = records()
    store = RedisStore(cluster.url, FP, retry_after_s=60)
    store.put_many(recs)
    where = holder(cluster, store)
    cluster.kill(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = store.get_many([r.key for r in recs])  # at once: only node 1's keys miss
        deadline = time.monotonic() + 20
        while b"cluster_state:fail" not in admin(cluster, 0).execute_command("CLUSTER", "INFO"):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        after = RedisStore(cluster.url, FP).get_many([r.key for r in recs])  # a new process: CLUSTERDOWN
    assert [b is None for b in before] == [where[r.key] == 1 for r in recs]
    assert after == [None] * N
    warned = [str(w.message) for w in caught if issubclass(w.category, StoreWarning)]
    # the first store: node 1 refused (1); the new one: node 1 refused, nodes 0 and 2 CLUSTERDOWN (3)
    assert len(warned) == 4 and sum("ClusterDownError" in m for m in warned) == 2, warned


def test_a_cluster_url_on_a_plain_server_is_a_miss_with_one_warning_not_an_exception(tmp_path):
    from cacheblend.tools.local_redis import RedisServer

    srv = RedisServer(tmp_path / "plain").start()  # not cluster-enabled: discovery fails
    try:
        store = RedisStore(f"redis+cluster://127.0.0.1:{srv.port}", FP)
        with pytest.warns(StoreWarning) as caught:
            assert store.get_many([r.key for r in records(3)]) == [None] * 3
            assert list(store.texts()) == [] and not store.available
            store.put_many(records(3))
        assert len([w for w in caught if issubclass(w.category, StoreWarning)]) == 1
    finally:
        srv.stop()
