"""The local redis-server helpers (tools/local_redis) start the server they launched. A port is
picked free and bound later, so another server can take it in between; before this was checked, a
server whose bind failed passed for started because the other one answered its PING (a 3-node
test cluster then ran on two processes, and killing "node 0" took "node 1" with it)."""

import redis

from cacheblend.tools.local_redis import RedisClusterNodes, RedisServer


def _pid(server: RedisServer) -> int:
    client = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        return int(client.info("server")["process_id"])
    finally:
        client.close()


def test_a_port_taken_since_it_was_picked_moves_the_server_to_a_free_one(tmp_path):
    first = RedisServer(tmp_path / "a").start()
    second = RedisServer(tmp_path / "b")
    second.port = first.port  # picked while free, bound by the first since
    try:
        second.start()
        assert second.port != first.port
        assert _pid(second) == second.proc.pid and _pid(first) == first.proc.pid
        first.kill()
        assert _pid(second) == second.proc.pid  # the second lives on its own port
    finally:
        first.stop()
        second.stop()


def test_a_port_taken_by_a_cluster_bus_moves_the_server_too(tmp_path):
    node = RedisServer(tmp_path / "node", **{"cluster-enabled": "yes"}).start()
    plain = RedisServer(tmp_path / "plain")
    plain.port = node.port + 10000  # the node's cluster bus: nothing answers INFO there
    try:
        plain.start()
        assert plain.port not in (node.port, node.port + 10000) and _pid(plain) == plain.proc.pid
    finally:
        node.stop()
        plain.stop()


def test_cluster_nodes_picked_the_same_port_still_make_three_processes(tmp_path):
    cluster = RedisClusterNodes(tmp_path / "cluster", 3)
    cluster.servers[1].port = cluster.servers[0].port
    cluster.servers[2].port = cluster.servers[0].port + 10000  # node 0's bus port
    try:
        cluster.start()
        pids = [_pid(s) for s in cluster.servers]
        assert pids == [s.proc.pid for s in cluster.servers] and len(set(pids)) == 3
        cluster.kill(0)
        assert [_pid(s) for s in cluster.servers[1:]] == pids[1:]  # the others live on
    finally:
        cluster.stop()


def test_a_restart_keeps_its_port_or_says_it_cannot(tmp_path):
    server = RedisServer(tmp_path / "s").start()
    port = server.port
    server.kill()
    server.start()  # its clients hold its URL: the same port
    assert server.port == port and _pid(server) == server.proc.pid
    server.kill()
    squatter = RedisServer(tmp_path / "squatter")
    squatter.port = port
    try:
        squatter.start()  # takes the port while the first is down
        assert squatter.port == port
        try:
            server.start()
            raise AssertionError("a restart moved to another port")
        except RuntimeError as exc:
            assert f"the last {port}" in str(exc) and server.port == port
    finally:
        squatter.stop()
        server.stop()
