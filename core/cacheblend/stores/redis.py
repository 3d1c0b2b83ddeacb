"""RedisStore: a chunk KV tier on a Redis / Valkey server that many processes and hosts share.

One key per chunk, ``cacheblend:<fingerprint[:16]>:kv:<chunk key>``, whose value is the same
self-describing record as a disk file (``integrity``: header with fingerprint, layout, key, text
and checksum), so a value written for another model, altered, or cut short is a miss. There is no
separate catalogue: ``texts()`` SCANs the keys and reads each value's header (``GETRANGE``, in
pipelined batches), so a record the server evicts takes its text with it and no eviction can hide
a record that is still there (one evicted after its header was read is named: a miss when used).
A ``cacheblend:<fp>:texts`` hash left by older versions is not read.

Eviction is the server's job: run it with ``maxmemory <bytes>`` and ``maxmemory-policy
allkeys-lfu`` (recency and popularity, server side: the hot set stays, one-off chunks go first);
``ttl_s`` sets an expiry on every value too. ``texts()`` reading a header is one LFU access.

The server is never trusted to be there. Every call has a bounded timeout and no retries; the first
failure (down, slow, out of memory) opens a circuit breaker for ``retry_after_s`` seconds during
which the tier is skipped, and warns once per outage. A query never raises because of Redis.
On Redis Cluster (``+cluster``) each primary has its own breaker and its own pipeline: a dead node
makes only its slots miss, one warning, if the servers run ``cluster-require-full-coverage no``
(with the default ``yes`` every node answers CLUSTERDOWN once the dead one is marked failed: one
warning per node). The URL's node must be up when a process first connects (discovery).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from . import compact, integrity
from .record import ChunkRecord, StoreWarning

SCHEMES = ("redis://", "rediss://", "unix://", "redis+cluster://", "rediss+cluster://")
_OPTIONS = {"ttl": "ttl_s", "timeout": "timeout_s", "retry_after": "retry_after_s"}  # URL query -> argument


def is_redis_url(target: object) -> bool:
    """Whether ``target`` names a Redis server rather than a folder."""
    return isinstance(target, str) and target.startswith(SCHEMES)


class RedisStore:
    """Chunk KV on a Redis server (URL forms: ``SCHEMES``; ``+cluster`` means Redis Cluster)."""

    shared = True  # every process attached to the server reads it: warming writes through

    def __init__(
        self,
        url: str,
        fingerprint: str,
        *,
        codec: str = "plain",
        ttl_s: float | None = None,
        timeout_s: float = 1.0,
        retry_after_s: float = 30.0,
    ) -> None:
        if not is_redis_url(url):
            raise ValueError(f"a Redis URL starts with one of {', '.join(SCHEMES)}; got {url!r}")
        if ttl_s is not None and ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive or None, got {ttl_s}")
        if codec not in compact.CODECS:
            raise ValueError(f"codec must be one of {', '.join(compact.CODECS)}; got {codec!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.url, self.fingerprint, self.codec = url, fingerprint, codec
        self.ttl_s, self.timeout_s, self.retry_after_s = ttl_s, timeout_s, retry_after_s
        self.prefix = f"cacheblend:{fingerprint[:16]}:"
        self.location = f"{url}#{self.prefix}"
        self._client: Any = None
        self._down_until = 0.0
        self._nodes_down: dict[str, float] = {}  # cluster primary "host:port" -> breaker open until

    @classmethod
    def from_url(cls, url: str, fingerprint: str, codec: str = "plain") -> RedisStore:
        """A store from a URL whose query may also set ``ttl``, ``timeout`` and ``retry_after``
        (seconds), e.g. ``redis://kv-host:6379/0?ttl=86400&timeout=0.5``; other query parameters
        go to redis-py."""
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        ours = {k: v for k, v in query if k in _OPTIONS}
        rest = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query if k not in _OPTIONS])))
        try:
            opts = {_OPTIONS[k]: float(v) for k, v in ours.items()}
        except ValueError as exc:
            raise ValueError(f"bad option in the Redis URL {_redact(url)!r}: {exc}") from exc
        return cls(rest, fingerprint, codec=codec, **opts)

    def __repr__(self) -> str:
        return f"RedisStore({_redact(self.url)!r})"

    @property
    def available(self) -> bool:
        """False while the circuit breaker is open (after a failure, for ``retry_after_s``)."""
        return time.monotonic() >= self._down_until

    # -- reads -----------------------------------------------------------------------------------
    def get(self, key: str) -> ChunkRecord | None:
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[str]) -> list[ChunkRecord | None]:
        """The records of ``keys`` in one pipelined round trip per node; None for each miss."""
        values = self._per_node([("get", self._kv(k)) for k in keys], None, raise_on_error=False)
        out: list[ChunkRecord | None] = []
        for key, value in zip(keys, values):
            out.append(self._decode(key, value) if value is not None else None)
        return out

    def __contains__(self, key: str) -> bool:
        return self.contains_many([key])[0]

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key has a value (one round trip; a value is checked when it is read)."""
        return [bool(n) for n in self._per_node([("exists", self._kv(k)) for k in keys], 0)]

    def texts(self) -> Iterable[str]:
        """The texts of the records stored for this fingerprint, read from their headers (every
        primary of a cluster is scanned; a node that fails is skipped with its warning)."""
        client = self._call(lambda c: c, None)
        found: list[str] = []
        for node, conn in _nodes(client) if client is not None else []:
            found += self._guard(node, lambda conn=conn: _header_texts(conn, self.prefix, self.fingerprint), [])
        return list(dict.fromkeys(found))

    # -- writes ----------------------------------------------------------------------------------
    def put(self, record: ChunkRecord) -> None:
        self.put_many([record])

    def put_many(self, records: Sequence[ChunkRecord]) -> None:
        """Writes the records in one pipelined round trip per node (skipped while down)."""
        if records:
            fp, codec, ttl = self.fingerprint, self.codec, self.ttl_s
            self._per_node([("set", self._kv(r.key), integrity.encode(r, fp, codec), ttl) for r in records], None)

    def discard(self, key: str) -> None:
        """Deletes one chunk's value (a corrupt or foreign one)."""
        self._per_node([("delete", self._kv(key))], None)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- internals -------------------------------------------------------------------------------
    def _kv(self, key: str) -> str:
        return f"{self.prefix}kv:{key}"

    def _decode(self, key: str, value: bytes | Exception) -> ChunkRecord | None:
        try:
            if isinstance(value, Exception):  # e.g. WRONGTYPE: something else under our key
                raise integrity.RecordError(str(value))
            return integrity.decode(value, self.fingerprint, key)
        except integrity.RecordError as exc:
            warnings.warn(f"bad KV value for chunk {key[:16]}... in {self!r} ({exc}); recomputing", StoreWarning, 3)
            self.discard(key)
            return None

    def _per_node(self, ops: list[tuple], fallback, raise_on_error: bool = True) -> list:
        """``ops`` (one per key, the key second) pipelined per node; a failed node's get ``fallback``."""
        out = [fallback] * len(ops)
        client = self._call(lambda c: c, None)
        groups: dict[str, tuple[Any, list[int]]] = {}
        for i, op in enumerate(ops if client is not None else []):
            try:
                node, conn = _node_of(client, op[1])
            except _errors():
                continue  # a slot no node serves now (SlotNotCoveredError): that key misses
            groups.setdefault(node, (conn, []))[1].append(i)
        for node, (conn, idx) in groups.items():
            run = lambda conn=conn, idx=idx: _pipelined(conn, [ops[i] for i in idx], raise_on_error)  # noqa: E731
            for i, value in zip(idx, self._guard(node, run, [fallback] * len(idx))):
                out[i] = value
        return out

    def _call(self, fn, fallback):
        """fn(client), or ``fallback`` with one warning per outage if the server fails."""
        return self._guard(None, lambda: fn(self._connect()), fallback)

    def _guard(self, node: str | None, fn, fallback):
        """fn(), or ``fallback`` with one warning per outage of ``node`` (a cluster primary; None:
        the whole store) if it fails; while its breaker is open, ``fallback`` at once."""
        now = time.monotonic()
        if now < self._down_until or (node is not None and now < self._nodes_down.get(node, 0.0)):
            return fallback
        try:
            return fn()
        except _errors() as exc:
            if node is None:
                self._down_until = time.monotonic() + self.retry_after_s
                self.close()
            else:
                self._nodes_down[node] = time.monotonic() + self.retry_after_s
            what = f"{self!r}" + (f" (cluster node {node}: only its slots)" if node is not None else "")
            warnings.warn(
                f"the Redis KV tier {what} failed ({type(exc).__name__}: {exc}); it is skipped for "
                f"{self.retry_after_s:g} s and chunks missing elsewhere are recomputed",
                StoreWarning,
                5,
            )
            return fallback

    def _connect(self) -> Any:
        if self._client is None:
            self._client = _client(self.url, self.timeout_s)
        return self._client


def _client(url: str, timeout_s: float) -> Any:
    """A redis-py client with bounded timeouts and no retries (the breaker decides when to retry)."""
    from redis import Redis
    from redis.backoff import NoBackoff
    from redis.cluster import RedisCluster
    from redis.retry import Retry

    opts = dict(socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0))
    if "+cluster://" in url:
        return RedisCluster.from_url(url.replace("+cluster://", "://", 1), **opts)
    return Redis.from_url(url, **opts)


def _errors() -> tuple[type[Exception], ...]:
    """What a failing server raises (RedisClusterException, e.g. at discovery, is no RedisError)."""
    from redis.exceptions import RedisClusterException, RedisError

    return RedisError, RedisClusterException, OSError


def _nodes(client: Any) -> list[tuple[str | None, Any]]:
    """(breaker name, plain client) of each server: one (None) for a plain server, every primary
    of a cluster."""
    if not hasattr(client, "get_primaries"):
        return [(None, client)]
    return [(n.name, client.get_redis_connection(n)) for n in client.get_primaries()]


def _node_of(client: Any, name: str) -> tuple[str | None, Any]:
    """(breaker name, plain client) of the server that holds key ``name`` (from the slot map)."""
    if not hasattr(client, "get_node_from_key"):
        return None, client
    node = client.get_node_from_key(name)
    return node.name, client.get_redis_connection(node)


def _pipelined(client: Any, ops: list[tuple], raise_on_error: bool = True) -> list:
    """Runs ``ops`` (("get", k) / ("exists", k) / ("set", k, v, ttl) / ("getrange", k, a, b) /
    ("strlen", k) / ("delete", k)) in one pipeline on one server. Connection errors always raise;
    ``raise_on_error=False`` returns a key's own error (WRONGTYPE: something else under our key)
    in its place, so one odd key does not open the breaker for all, and raises any other (a
    server-wide state: CLUSTERDOWN, MOVED, LOADING)."""
    pipe = client.pipeline(transaction=False)
    for op, *args in ops:
        if op == "set":
            key, value, ttl = args
            pipe.set(key, value, px=int(ttl * 1000) if ttl else None)
        else:
            getattr(pipe, op)(*args)
    out = pipe.execute(raise_on_error=raise_on_error)
    bad = next((r for r in out if isinstance(r, Exception) and not str(r).startswith("WRONGTYPE")), None)
    if bad is not None:
        raise bad
    return out


_HEAD = 4096  # bytes of a value read first for its header (a chunk text is usually shorter)


def _header_texts(conn: Any, prefix: str, fingerprint: str, batch: int = 128) -> list[str]:
    """The texts in the headers of the records under ``prefix`` on one server: SCAN, then per
    batch one pipeline of GETRANGE (the first 4 KiB) and STRLEN, and one more for headers longer
    than that. A value that is not a whole record of ours (or gone meanwhile) is left out."""
    names = list(conn.scan_iter(match=f"{prefix}kv:*", count=1000))
    texts: list[str] = []
    for at in range(0, len(names), batch):
        part = names[at : at + batch]
        got = _pipelined(conn, [op for n in part for op in (("getrange", n, 0, _HEAD - 1), ("strlen", n))], False)
        heads, sizes = got[0::2], got[1::2]
        spans = [integrity.header_span(h) if isinstance(h, bytes) else 0 for h in heads]
        longer = [i for i, h in enumerate(heads) if spans[i] > _HEAD and len(h) == _HEAD]
        for i, h in zip(longer, _pipelined(conn, [("getrange", part[i], 0, spans[i] - 1) for i in longer], False)):
            heads[i] = h
        for name, head, size in zip(part, heads, sizes):
            key = (name.decode() if isinstance(name, bytes) else name)[len(prefix) + 3 :]
            try:
                meta, _, end = integrity.parse_header(head, fingerprint, key)
            except (integrity.RecordError, TypeError):
                continue  # not ours, torn, or evicted after the scan (b""): a miss when read
            if end == size:
                texts.append(meta["text"])
    return texts



def _redact(url: str) -> str:
    """The URL without its password."""
    head, sep, tail = url.rpartition("@")
    if not sep:
        return url
    scheme, _, _ = head.partition("://")
    return f"{scheme}://***@{tail}"
