"""Two `cacheblend serve` replicas at once, under a mixed loopback load, on one real store (a disk
folder, or a 3-node Redis Cluster), with warm on miss writing from both; then a cluster node killed
mid-load. No mocks: every server is a real process on 127.0.0.1.

The answer check ("0 wrong answers"): every response must equal the answer an in-process reference
engine gives for the same prompt (temperature 0, same max tokens) in the store state the response
reports. With ``--neighbours 0`` a chunk's record is computed behind the chunk context alone, so
whichever replica warms a chunk writes the same bytes, and a prompt's blend depends only on which
of its 2 documents were found: the reference answers the states "none warmed", "both warmed" and
each single one warmed, and a response whose usage says (hits, misses) must equal one of the
answers of the states with those counts.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed

import httpx
import pytest
import torch
from live_server import metric
from test_cli_serve import serve_processes

from cacheblend import BlendConfig, BlendEngine
from cacheblend.serving.protocol import parse_chat
from cacheblend.stores import StoreWarning, compact, open_tier
from cacheblend.tools.local_redis import RedisClusterNodes

MAX_TOKENS = 6

# never-seen documents, one fact each (distinct enough that no document contains another)
FACTS = [
    "The ferry across the Tane river is pulled along a steel cable by a diesel winch.",
    "In winter the ferry stops at dusk, and the last crossing leaves the north bank at four.",
    "Tickets are sold on board; cyclists pay half fare and dogs travel free of charge.",
    "The lighthouse on Korra point was built of granite blocks shipped from the mainland in 1871.",
    "Its keeper rowed to the village every Sunday for bread, lamp oil and the week's newspapers.",
    "The orchard behind the mill grows eleven kinds of apple and two of quince on a south slope.",
    "Cider from the orchard is pressed in October and sold at the harvest fair in the square.",
    "The night train to Velmar has four sleeping cars and a dining car that closes at ten.",
    "Passengers who board after midnight must show their ticket to the guard at the rear door.",
    "A colony of grey herons nests each spring in the alder trees along the canal towpath.",
    "The canal's nine locks lift boats forty metres between the harbour and the upper basin.",
    "The village library lends telescopes, seed packets and sewing machines as well as books.",
    "Choir practice is held in the chapel on Thursday evenings, and newcomers sing alto first.",
    "The glass works on Ferrin street melts sand from the dunes in a furnace that never goes out.",
    "Its apprentices spend three years blowing bottles before they may shape a single goblet.",
    "The market opens at six on Saturdays; fishmongers take the north row and bakers the south.",
    "A tram line climbs the hill to the observatory, turning on a loop around the old reservoir.",
    "The observatory's brass refractor was restored in 1990 and opens to visitors on clear Fridays.",
    "Snow closes the mountain pass most years from December until the first week of April.",
    "The hut below the pass keeps blankets, a stove and a logbook that every walker signs.",
    "The town clock loses a minute a week, so the sexton climbs the tower each Monday to set it.",
    "Wool from the upland farms is spun in the old school house, which the weavers bought in 1962.",
    "A ferry pilot must log two hundred crossings with an instructor before steering alone.",
    "The bakery's rye loaf is proved overnight in willow baskets and baked before dawn.",
    "Fog horns on the breakwater sound twice a minute whenever visibility drops below a mile.",
    "The museum keeps a whale skeleton in its atrium, hung from the roof beams on steel wires.",
    "Every August the river festival ends with a race of home-made rafts from the weir to the bridge.",
    "The cheese cellar under the abbey holds four hundred wheels, each turned by hand once a week.",
    "Ice skating on the mill pond is allowed only after the warden has measured ten centimetres of ice.",
    "The bus to the coast leaves the depot at seven and stops at every farm gate that shows a flag.",
]
QUESTIONS = ["What is this about?", "Give one detail.", "When does it happen?", "Who is involved?", "Where is it?"]


def _body(docs: tuple[str, ...], q: int) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": QUESTIONS[q % len(QUESTIONS)]}],
            "documents": list(docs), "max_tokens": MAX_TOKENS, "temperature": 0}


# -- the reference -----------------------------------------------------------------------------------
class Reference:
    """The in-process reference: one loaded model and a few engines over it, each its own store state.

    Every engine looks for all of FACTS in prompts; which it has warmed decides a prompt's state:
    ``none`` warms nothing, ``all`` every document a prompt holds, and ``(bit, value)`` those whose
    index in FACTS has that bit: for two documents of a prompt one bit differs, so that engine and
    its complement give the two states "only one of them warmed". (A prompt's blend reads only its
    own chunks' records, and with ``neighbours=0`` a record does not depend on what else was warmed.)
    Documents are warmed one per ``warm`` call, as warm on miss does."""

    def __init__(self, model_dir: str) -> None:
        self.engine = BlendEngine.from_pretrained(model_dir, device="cpu", config=BlendConfig(neighbours=0))
        self._engines: dict[object, BlendEngine] = {}
        self._answers: dict[tuple, dict[tuple[int, int], set[tuple]]] = {}

    def fresh(self) -> BlendEngine:
        base = self.engine
        engine = BlendEngine(base.adapter.model, base.tokenizer, config=BlendConfig(neighbours=0), name=base.name)
        engine.kv.expect(FACTS)  # looked for in prompts, as the server does with a request's documents
        return engine

    def _state(self, name: object, warm: list[str]) -> BlendEngine:
        engine = self._engines.get(name) or self._engines.setdefault(name, self.fresh())
        for text in warm:
            engine.warm([text])  # idempotent: a text warmed before costs nothing
        return engine

    def _generate(self, engine: BlendEngine, prompt: str, counts: tuple[int, int]) -> tuple:
        """The answer and the token counts the state gives (what a response must match)."""
        out = engine.generate(prompt, max_new_tokens=MAX_TOKENS, temperature=0)
        st = out.stats
        assert (st.chunk_hits, st.chunk_misses) == counts, (st, counts)
        return (out.text, st.prompt_tokens, st.completion_tokens, st.reused_tokens - st.head_tokens, st.hit_tokens,
                st.recomputed_tokens + st.head_tokens)  # as if the head were computed: whether an engine has
        # its head cached yet depends on the requests it served before (tests/core/test_head_cache.py)

    def answers(self, docs: tuple[str, ...], q: int) -> dict[tuple[int, int], set[tuple]]:
        """(hits, misses) -> the outcomes (``_generate``) of the store states with those counts."""
        if (docs, q) not in self._answers:
            assert len(docs) == 2 and docs[0] != docs[1]
            prompt = parse_chat(_body(docs, q), self.engine.tokenizer).prompt
            i, j = (FACTS.index(d) for d in docs)
            bit = next(b for b in range(8) if (i >> b & 1) != (j >> b & 1))
            self._answers[(docs, q)] = {
                (0, 2): {self._generate(self._state("none", []), prompt, (0, 2))},
                (2, 0): {self._generate(self._state("all", list(docs)), prompt, (2, 0))},
                (1, 1): {self._generate(self._state((bit, k >> bit & 1), [d]), prompt, (1, 1))
                         for k, d in ((i, docs[0]), (j, docs[1]))},
            }
        return self._answers[(docs, q)]

    def record(self, text: str):
        """The record of ``text`` as a fresh engine's own ``warm`` computes it."""
        engine = self.fresh()
        engine.warm([text])
        (record,) = engine.kv.stores.get_many(engine.kv.keys([text]))
        return record

    def keys(self, texts: list[str]) -> list[str]:
        return self.engine.kv.keys(texts)

    def codec(self) -> str:
        return compact.codec_for(self.engine.config.kv_dtype)


@pytest.fixture(scope="module")
def reference(tiny_model_dir) -> Reference:
    return Reference(tiny_model_dir)


def check_answer(reference: Reference, docs: tuple[str, ...], q: int, body: dict) -> tuple[int, int]:
    """Asserts the response equals the reference in a store state with its (hits, misses): the
    answer, and the token counts (prompt, completion, reused, in hit chunks, recomputed), which for
    one hit also say which document it was when their lengths differ. Returns (hits, misses)."""
    usage = body["usage"]
    counts = (usage["cacheblend"]["chunk_hits"], usage["cacheblend"]["chunk_misses"])
    head = usage["cacheblend"]["head_tokens"]
    got = (body["choices"][0]["message"]["content"], usage["prompt_tokens"], usage["completion_tokens"],
           usage["prompt_tokens_details"]["cached_tokens"] - head, usage["cacheblend"]["chunk_tokens"],
           usage["cacheblend"]["recomputed_tokens"] + head)
    expected = reference.answers(docs, q)
    assert counts in expected, f"usage {usage} names no store state of {len(docs)} documents"
    assert got in expected[counts], (
        f"wrong answer {got} for {counts} (hits, misses): expected one of {expected[counts]} "
        f"(all states: {expected}); question {q}, documents {docs}")
    return counts


def state_dependent(reference: Reference, requests) -> int:
    """How many of ``requests`` ((docs, q)) have answer texts that differ between store states: the
    requests on which the answer check tells a state from another by the text alone."""
    return sum(len({o[0] for outs in reference.answers(d, q).values() for o in outs}) > 1 for d, q in requests)


# -- the servers -------------------------------------------------------------------------------------
def replicas(model: str, store: str, workdir, n: int = 2, while_starting=None):
    """``n`` replicas (`cacheblend serve --neighbours 0 --threads 1`) on one store, all running at once;
    ``while_starting()`` runs in this process while they load (the reference's answers, say)."""
    return serve_processes(model, store, workdir, n, extra=("--neighbours", "0", "--threads", "1"),
                           while_starting=while_starting)


def _cluster(workdir, stack: contextlib.ExitStack) -> RedisClusterNodes:
    # full coverage "no": the live nodes keep serving their slots while one is down (docs/STORES.md,
    # the README's Redis section); with the default "yes" every node answers CLUSTERDOWN once the
    # dead one is marked failed
    cluster = RedisClusterNodes(workdir / "cluster", 3, **{"cluster-require-full-coverage": "no"})
    stack.callback(cluster.stop)
    return cluster.start()


def _chat(url: str, docs: tuple[str, ...], q: int) -> tuple[int, dict | str, float, float]:
    """One request: (status, body or text, start, end on the monotonic clock)."""
    start = time.monotonic()
    out = httpx.post(url + "/v1/chat/completions", json=_body(docs, q), timeout=120)
    end = time.monotonic()
    return out.status_code, (out.json() if out.status_code == 200 else out.text), start, end


def _drained(url: str) -> bool:
    done = sum(metric(url, f"warm_on_miss_{n}") for n in ("warmed", "failed", "dropped"))
    return metric(url, "warm_on_miss_queued") == 0 and done >= metric(url, "warm_on_miss_offered")


def _wait_drained(urls: list[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(_drained(u) for u in urls):
        assert time.monotonic() < deadline, "warm on miss did not drain its queue"
        time.sleep(0.1)


def _overlap(spans_a, spans_b) -> bool:
    return any(a1 < b2 and a2 < b1 for a1, b1 in spans_a for a2, b2 in spans_b)


# -- 1. two replicas at once, mixed load, warm on miss from both ---------------------------------------
def _mixed_jobs(first: str, second: str) -> list[tuple[str, tuple[str, str], int]]:
    """32 requests over FACTS[:16], interleaved between the replicas: never-seen pairs (each replica
    its own, so both miss), the other replica's pairs again, overlapping pairs, new pairs, repeats,
    then pairs of one known and one never-seen document."""
    d = FACTS
    pairs_a, pairs_b = [(0, 1), (2, 3)], [(4, 5), (6, 7)]
    plan = [(first, pairs_a[0]), (second, pairs_b[0]), (first, pairs_a[1]), (second, pairs_b[1]),  # misses
            (first, pairs_b[0]), (second, pairs_a[0]), (first, pairs_b[1]), (second, pairs_a[1]),  # repeats
            (first, (1, 2)), (second, (5, 6)), (first, (3, 4)), (second, (7, 0)),  # overlaps
            (first, (8, 9)), (second, (10, 11)), (first, (9, 10)), (second, (11, 8)),  # new, overlapping
            (first, (10, 11)), (second, (8, 9)), (first, (0, 1)), (second, (4, 5)),  # repeats
            (first, (2, 5)), (second, (6, 1)), (first, (7, 3)), (second, (0, 4)),  # new mixes of known
            (first, (11, 8)), (second, (9, 10)), (first, (5, 6)), (second, (1, 2)),
            (first, (12, 0)), (second, (13, 4)), (first, (6, 14)), (second, (2, 15))]  # half new
    return [(url, (d[i], d[j]), k) for k, (url, (i, j)) in enumerate(plan)]


@pytest.mark.parametrize("kind", ["disk", "redis-cluster"])
def test_two_replicas_under_mixed_load_warm_on_miss_from_both(tiny_model_dir, tmp_path, reference, kind):
    """Two replicas on one store under 32 interleaved requests, 6 at a time: every answer equals the
    reference's in the store state its usage reports; each replica's warm on miss warmed chunks into
    the shared store; every document's record there reads back (no StoreWarning) equal to the
    reference's own warm."""
    with contextlib.ExitStack() as stack:
        store = _cluster(tmp_path, stack).url if kind == "redis-cluster" else str(tmp_path / "kv")

        def references():  # computed while the replicas load (the job list needs no URL for this)
            for _, docs, q in _mixed_jobs("", ""):
                reference.answers(docs, q)

        first, second = stack.enter_context(replicas(tiny_model_dir, store, tmp_path, while_starting=references))
        jobs = _mixed_jobs(first, second)
        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(lambda job: _chat(*job), jobs))

        counts = []
        for (url, docs, q), (status, body, _, _) in zip(jobs, results):
            assert status == 200, body
            counts.append(check_answer(reference, docs, q, body))
        spans = {u: [(a, b) for (url, _, _), (_, _, a, b) in zip(jobs, results) if url == u] for u in (first, second)}
        assert _overlap(spans[first], spans[second]), "no request to one replica overlapped one to the other"
        assert any(h == 0 for h, _ in counts) and any(h > 0 for h, _ in counts), counts  # misses, and hits
        # the tiny random model's 6-token answers mostly ignore the documents; the check is not
        # vacuous: some requests' answers differ between states (and every token count is checked)
        assert state_dependent(reference, [(docs, q) for _, docs, q in jobs]) > 0

        # (b) warm on miss wrote from both replicas
        _wait_drained([first, second])
        warmed = {u: metric(u, "warm_on_miss_warmed") for u in (first, second)}
        assert all(n > 0 for n in warmed.values()), warmed
        for u in (first, second):
            assert metric(u, "warm_on_miss_failed") == 0 and metric(u, "warm_on_miss_dropped") == 0

        # (c) every document's record is in the shared store, whole and equal to the reference's
        texts = sorted({t for _, docs, _ in jobs for t in docs})
        tier = open_tier(store, reference.engine.kv.fingerprint, reference.codec())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            records = tier.get_many(reference.keys(texts))
        assert not [w for w in caught if issubclass(w.category, StoreWarning)], [str(w.message) for w in caught]
        for text, record in zip(texts, records):
            assert record is not None, f"no record for {text!r} in {store}"
            expected = reference.record(text)
            assert record.kv.dtype == expected.kv.dtype and torch.equal(record.kv, expected.kv), text
        print(f"\n[{kind}] (hits, misses) per request: {counts}; warm_on_miss_warmed per replica: "
              f"{list(warmed.values())}")


# -- 2. a cluster node killed mid-load -------------------------------------------------------------------
def _node_index(cluster: RedisClusterNodes, fingerprint: str, key: str) -> int:
    """Which node of ``cluster`` holds chunk ``key``'s record (slots split as RedisClusterNodes does)."""
    from redis.cluster import key_slot

    slot = key_slot(f"cacheblend:{fingerprint[:16]}:kv:{key}".encode())
    n = len(cluster.servers)
    return next(i for i in range(n) if 16384 * i // n <= slot < 16384 * (i + 1) // n)


def _nodes_report(cluster: RedisClusterNodes, dead: int) -> str:
    lines = [f"node {dead} was killed; a live node refused a connection"]
    for i, srv in enumerate(cluster.servers):
        code = None if srv.proc is None else srv.proc.poll()
        tail = (srv.workdir / "redis.log").read_text(errors="replace").splitlines()[-6:]
        lines += [f"node {i} port {srv.port} exit {code}:"] + ["    " + t for t in tail]
    return "\n".join(lines)


def _wait_marked_failed(cluster: RedisClusterNodes, dead: int, timeout: float = 20.0) -> None:
    """Until every live node's CLUSTER NODES flags the dead node ``fail`` (not just ``fail?``)."""
    import redis

    port = f"127.0.0.1:{cluster.servers[dead].port}@"
    live = [redis.Redis(host="127.0.0.1", port=s.port) for i, s in enumerate(cluster.servers) if i != dead]
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                views = [next(line for line in admin.execute_command("CLUSTER", "NODES").decode().splitlines()
                              if port in line) for admin in live]
            except redis.ConnectionError as exc:  # a live node gone: say how it ended, with its log's tail
                raise AssertionError(_nodes_report(cluster, dead)) from exc
            if all("fail" in line.split()[2].split(",") for line in views):
                return
            assert time.monotonic() < deadline, f"the live nodes did not mark node {dead} failed: {views}"
            time.sleep(0.1)
    finally:
        for admin in live:
            admin.close()


def test_cluster_node_killed_mid_load(tiny_model_dir, tmp_path, reference):
    """Two replicas on a 3-node cluster (full coverage not required), a first document set warmed,
    then 24 interleaved requests, 6 at a time, with one node SIGKILLed after the 8th answer: every
    request answers 200 with the reference's answer for the store state it reports, and both
    replicas keep serving afterwards.

    Observed (redis-py cluster client, ``cluster-require-full-coverage no``, retry_after 30 s): only
    the dead node's slots miss. Each replica's breaker opens for that node alone (one StoreWarning
    naming it) and the two live nodes keep answering, so after the kill a replica that never read a
    chunk of a live node still hits it from the cluster, while a chunk of the dead node is a miss
    unless the replica holds it in its memory tier (read or warmed before): the probes below, never
    read by the second replica, answer (1 hit, 1 miss) there and (2 hits, 0 misses) on the first,
    which warmed them. A missed chunk is still warmed on miss after the kill (into memory; its write
    to the dead node is skipped), so the replica's next request holding it hits. The load itself ends
    within about a second of the kill, before the live nodes mark the dead one failed (about 2 s
    here): in that window the dead node refuses connections and only its slots miss either way.

    With the default ``cluster-require-full-coverage yes`` (tried by hand, not run here) everything
    up to the FAIL mark is the same and every answer was still right, but then the live nodes answer
    CLUSTERDOWN, each node's breaker opens in turn and the whole cluster is skipped for retry_after:
    the second replica's probe is (0 hits, 2 misses); the first still (2, 0) from its memory."""
    warmed_set, new_set = FACTS[16:24], FACTS[24:30]
    with contextlib.ExitStack() as stack:
        cluster = _cluster(tmp_path, stack)
        fp = reference.engine.kv.fingerprint
        node = {t: _node_index(cluster, fp, k) for t, k in zip(FACTS, reference.keys(FACTS))}
        # the node to kill: one holding records of the warmed set, with a live node holding others
        dead = max(range(3), key=lambda i: sum(node[t] == i for t in warmed_set))
        probe = (next(t for t in warmed_set if node[t] != dead), next(t for t in warmed_set if node[t] == dead))
        load_docs = [t for t in warmed_set if t not in probe] + new_set  # 6 warmed, then 6 never seen
        pairs = [(load_docs[i], load_docs[j]) for i, j in
                 [(0, 1), (6, 7), (2, 3), (8, 9), (4, 5), (10, 11), (1, 2), (7, 8), (3, 4), (9, 10), (5, 0),
                  (11, 6), (0, 6), (1, 7), (2, 8), (3, 9), (4, 10), (5, 11), (0, 1), (6, 7), (2, 3), (8, 9),
                  (4, 5), (10, 11)]]

        def references():
            for k, docs in enumerate(pairs):
                reference.answers(docs, k)
            reference.answers(probe, 0)

        first, second = stack.enter_context(replicas(tiny_model_dir, cluster.url, tmp_path, while_starting=references))
        assert httpx.post(first + "/v1/documents", json={"documents": warmed_set}, timeout=120).json()["warmed"] == 8
        jobs = [((first, second)[k % 2], docs, k) for k, docs in enumerate(pairs)]
        killed_at = None
        with ThreadPoolExecutor(6) as pool:
            futures = {pool.submit(_chat, *job): job for job in jobs}
            results = {}
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                if len(results) == 8:
                    cluster.kill(dead)
                    killed_at = time.monotonic()
        assert killed_at is not None
        after = {first: [], second: []}
        for job in jobs:
            url, docs, q = job
            status, body, start, _ = results[job]
            assert status == 200, f"{status} from {url} after the node loss: {body}"
            counts = check_answer(reference, docs, q, body)
            if start > killed_at:
                after[url].append(counts)
        assert any(after.values()), "no request started after the kill"

        # the load above ends within about a second of the kill, before the live nodes mark the dead
        # one failed (cluster-node-timeout 1 s, then a majority vote): wait for that, then a second
        # wave (the servers keep serving) and the probes, in the cluster's settled state
        _wait_marked_failed(cluster, dead)
        wave = [((second, first)[k % 2], pairs[k], k) for k in range(12)]
        with ThreadPoolExecutor(6) as pool:
            for (url, docs, q), (status, body, _, _) in zip(wave, pool.map(lambda job: _chat(*job), wave)):
                assert status == 200, f"{status} from {url} once the node was marked failed: {body}"
                after[url].append(check_answer(reference, docs, q, body))

        # the probes (warmed by the first, never read by the second) show what a replica finds now:
        # the live node's record, not the dead one's
        probes = {}
        for url in (first, second):
            status, body, _, _ = _chat(url, probe, 0)
            assert status == 200, body
            probes[url] = check_answer(reference, probe, 0, body)
            assert httpx.get(url + "/health").json()["status"] == "ok"
        assert probes == {first: (2, 0), second: (1, 1)}, probes
        logs = [(tmp_path / f"serve{i}.log").read_text(errors="replace") for i in range(2)]
        breaker = [[line.split("StoreWarning: ", 1)[-1][:120] for line in log.splitlines() if "StoreWarning" in line]
                   for log in logs]
        print(f"\n[node loss] killed node {dead}; (hits, misses) of requests started after the kill: "
              f"first {after[first]}, second {after[second]}; probes {list(probes.values())}; "
              f"StoreWarnings per replica: {breaker}")
