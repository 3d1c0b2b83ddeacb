"""RedisStore: a chunk KV tier on a Redis / Valkey server that many processes and hosts share.

One key per chunk, ``cacheblend:<fingerprint[:16]>:kv:<chunk key>``, whose value is the same
self-describing record as a disk file (``integrity``: header with fingerprint, layout, key and
checksum), so a value written for another model, altered, or cut short is a miss. The texts of the
warmed chunks live in one hash per fingerprint, ``cacheblend:<fingerprint[:16]>:texts`` (chunk key
-> text), so a new process finds chunks in prompts without warming anything.

The server is never trusted to be there. Every call has a bounded timeout and no retries; the first
failure (down, slow, out of memory) opens a circuit breaker for ``retry_after_s`` seconds during
which the tier is skipped, and warns once per outage. A query never raises because of Redis.

Eviction is the server's job: run it with ``maxmemory <bytes>`` and ``maxmemory-policy
allkeys-lru``; ``ttl_s`` sets an expiry on every chunk value in addition.
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
        """The records of ``keys`` in one pipelined round trip; None for each miss."""
        gets = [("get", self._kv(k)) for k in keys]
        values = self._call(lambda c: _pipelined(c, gets, raise_on_error=False), [None] * len(keys))
        out: list[ChunkRecord | None] = []
        for key, value in zip(keys, values):
            out.append(self._decode(key, value) if value is not None else None)
        return out

    def __contains__(self, key: str) -> bool:
        return self.contains_many([key])[0]

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key has a value (one round trip; a value is checked when it is read)."""
        found = self._call(lambda c: _pipelined(c, [("exists", self._kv(k)) for k in keys]), [0] * len(keys))
        return [bool(n) for n in found]

    def texts(self) -> Iterable[str]:
        """Every chunk text warmed into this server for this fingerprint."""
        found = self._call(lambda c: c.hvals(self._texts_key()), [])
        return [t.decode("utf-8") for t in found]

    # -- writes ----------------------------------------------------------------------------------
    def put(self, record: ChunkRecord) -> None:
        self.put_many([record])

    def put_many(self, records: Sequence[ChunkRecord]) -> None:
        """Writes the records and their texts in one pipelined round trip (skipped while down)."""
        if not records:
            return
        ops: list[tuple] = []
        for rec in records:
            ops.append(("set", self._kv(rec.key), integrity.encode(rec, self.fingerprint, self.codec), self.ttl_s))
            ops.append(("hset", self._texts_key(), rec.key, rec.text))
        self._call(lambda c: _pipelined(c, ops), None)

    def discard(self, key: str) -> None:
        """Deletes one chunk's value (a corrupt or foreign one)."""
        self._call(lambda c: c.delete(self._kv(key)), None)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- internals -------------------------------------------------------------------------------
    def _kv(self, key: str) -> str:
        return f"{self.prefix}kv:{key}"

    def _texts_key(self) -> str:
        return f"{self.prefix}texts"

    def _decode(self, key: str, value: bytes | Exception) -> ChunkRecord | None:
        try:
            if isinstance(value, Exception):  # e.g. WRONGTYPE: something else under our key
                raise integrity.RecordError(str(value))
            return integrity.decode(value, self.fingerprint, key)
        except integrity.RecordError as exc:
            warnings.warn(f"bad KV value for chunk {key[:16]}... in {self!r} ({exc}); recomputing", StoreWarning, 3)
            self.discard(key)
            return None

    def _call(self, fn, fallback):
        """fn(client), or ``fallback`` with one warning per outage if the server fails."""
        if not self.available:
            return fallback
        from redis.exceptions import RedisError

        try:
            return fn(self._connect())
        except (RedisError, OSError) as exc:
            self._down_until = time.monotonic() + self.retry_after_s
            self.close()
            warnings.warn(
                f"the Redis KV tier {self!r} failed ({type(exc).__name__}: {exc}); it is skipped for "
                f"{self.retry_after_s:g} s and chunks missing elsewhere are recomputed",
                StoreWarning,
                4,
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


def _pipelined(client: Any, ops: list[tuple], raise_on_error: bool = True) -> list:
    """Runs ``ops`` (("get", k) / ("exists", k) / ("set", k, v, ttl) / ("hset", h, f, v)) in one
    pipeline. Connection errors always raise; ``raise_on_error=False`` returns a failed command's
    error in its place (one odd key must not open the breaker for all)."""
    pipe = client.pipeline(transaction=False)
    for op, *args in ops:
        if op == "set":
            key, value, ttl = args
            pipe.set(key, value, px=int(ttl * 1000) if ttl else None)
        else:
            getattr(pipe, op)(*args)
    return pipe.execute(raise_on_error=raise_on_error)


def _redact(url: str) -> str:
    """The URL without its password."""
    head, sep, tail = url.rpartition("@")
    if not sep:
        return url
    scheme, _, _ = head.partition("://")
    return f"{scheme}://***@{tail}"
