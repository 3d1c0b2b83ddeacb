"""Warming a corpus on Ray: one engine per actor, records written to a shared tier.

    from cacheblend.distributed import RayWarmOptions, warm_corpus
    report = warm_corpus(texts, model="smollm2-135m-instruct", store="/shared/kv",   # or redis://...
                         options=RayWarmOptions(address="auto", workers=8, threads=1))

The records are byte-identical to one process's ``BlendEngine(...).warm(texts)`` into an empty
store. That takes more than handing each actor a shard and its neighbour lists: the Warmer
computes a chunk's plain record (behind its neighbour) in a forward of its own, the same
whichever call does it, but its lead record (behind the chunk context alone) comes either "for
free" out of the forward of the first chunk in length order whose first neighbour it is (a
longer sequence), or, when it is nobody's first neighbour, alone in a padded batch with the
other such chunks; and the floats of a row depend on the shapes of the forward it was in
(measured on the tiny test model: 6e-7 apart between alone, padded beside longer chunks, and
taken from a neighbour's forward; only an equal padded width gave equal bytes). A shard warmed
by ``engine.warm`` decides free or alone by what its own call holds and what is already stored,
so neither a split corpus nor a re-run after a partial write reproduces the one-process choices.

So the plan (``plan_units``, run once in one actor) makes those choices for the whole corpus, as
``warming.Warmer`` would, and cuts the work into independent units that reproduce them: a
*chain* (chunks linked by "its lead record is taken from that one's forward": a path or a
cycle) computes every plain record of its members and the lead records taken along it; an
*alone batch* (the global batches of lead records computed alone) computes exactly those. Each
unit runs the engine's own ``Warmer`` in a scratch memory tier, with the records another unit
owns left out (a chain's last lead) or marked present (an alone batch's plain records), writes
its records to the shared tier and reports their keys. A unit computes the same bytes whatever
is stored, so a re-run after a killed worker recomputes the units not fully stored and the
result is still identical. Written records are atomic (a disk store renames, Redis SETs).

Plain Ray actors, not Ray Data: the units are a few hundred small Python objects, not tabular
rows; the records go straight from each actor to the store, never through Ray's object store;
the driver needs each unit's done report and a dead actor's lost unit, which Ray Data's
streaming executor retries and hides; and Ray Data needs pyarrow and pandas (``ray[data]``),
which the default ``ray`` install lacks. Not measured against Ray Data.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .config import BlendConfig


@dataclass(frozen=True)
class RayWarmOptions:
    """Where and how ``warm_corpus`` runs. address: a Ray address ("auto", "ray://host:10001",
    "host:6379"), or None / "local": the Ray this process is connected to, else a new local one
    (``workers * threads`` CPUs, shut down at the end). workers: actors, each one engine of
    ``threads`` torch threads on ``device``. batch_size: as ``BlendEngine.warm``'s (it decides
    the padded batches of alone lead records). on_report: called with each ``UnitDone``."""

    address: str | None = None
    workers: int = 2
    threads: int = 1
    batch_size: int = 8
    device: str = "cpu"
    on_report: Callable[[UnitDone], None] | None = None


@dataclass(frozen=True)
class Unit:
    """One independent piece of work. chunks: ``WarmChunk``s in corpus order (lead None where
    another unit computes that lead record); given: text -> the neighbours it is computed
    behind; present: keys to mark present (computed by another unit); keys: what it stores."""

    chunks: tuple
    given: dict
    present: tuple[str, ...]
    keys: tuple[str, ...]


@dataclass(frozen=True)
class UnitDone:
    """A unit's records are in the store: which worker (index, pid), its keys, computed, seconds."""

    worker: int
    pid: int
    keys: tuple[str, ...]
    computed: int
    seconds: float


@dataclass
class RayWarmReport:
    """What ``warm_corpus`` did. chunks: distinct chunks; records: records the corpus needs
    (plain and lead); stored_before: of those, already in the store; computed: records computed
    now; per_worker: records computed by each worker; done: keys reported stored this run;
    missing: keys not stored (the units of workers that died: re-run to finish them);
    load_s / warm_s: actors started and models loaded / planning and warming."""

    chunks: int
    records: int
    stored_before: int = 0
    computed: int = 0
    per_worker: list[int] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    dead_workers: list[int] = field(default_factory=list)
    load_s: float = 0.0
    warm_s: float = 0.0

    @property
    def complete(self) -> bool:
        return not self.missing


def plan_units(engine: Any, texts: Sequence[str], batch_size: int, known: Sequence[str] = ()) -> list[Unit]:
    """The units that warm ``texts`` as ``engine.warm(texts, batch_size=...)`` would into a store
    holding the chunk texts ``known`` (their records not yet computed: they only join the
    neighbour pool, as a store's texts do). ValueError for a text ``warm`` refuses."""
    from .neighbours import NeighbourIndex

    w = engine.kv.warmer
    uniq: dict[str, Any] = {}
    for chunk in w.prepare(texts):
        uniq.setdefault(chunk.key, chunk)  # the Warmer keeps a key's first chunk
    chunks = list(uniq.values())
    order = sorted(chunks, key=lambda c: len(c.ids))  # the Warmer's compute order
    k = engine.kv.neighbours
    if not k:  # padded batches behind the chunk context: one unit per batch
        return [Unit(tuple(b), {}, (), tuple(c.key for c in b)) for b in _batches(order, batch_size)]
    index = NeighbourIndex()
    index.add([c.text for c in chunks], [c.ids for c in chunks])
    rest = sorted(t for t in known if t not in index)
    index.add(rest, [w.tokenize(t) for t in rest])
    given: dict[str, list[str]] = {}
    for batch in _batches(order, batch_size):  # as Warmer._contexts asks the index, batch by batch
        given.update(w.nearest(batch, index))
    by_lead = {c.lead: c for c in chunks if c.lead is not None}
    taker: dict[str, Any] = {}  # lead key -> the chunk whose forward yields it
    for c in order:
        _, first = w.place(c, given[c.text], index)
        lead = w.keys(first)[1] if first is not None else None
        if lead in by_lead and lead not in taker:
            taker[lead] = c
    parent = {c.key: c.key for c in chunks}

    def root(key: str) -> str:
        while parent[key] != key:
            parent[key] = key = parent[parent[key]]
        return key

    for lead, c in taker.items():
        parent[root(by_lead[lead].key)] = root(c.key)
    groups: dict[str, list[Any]] = {}
    for c in chunks:
        groups.setdefault(root(c.key), []).append(c)
    alone = [c for c in chunks if c.lead is not None and c.lead not in taker]
    units = []
    for members in groups.values():
        kept = tuple(c if c.lead in taker else replace(c, lead=None) for c in members)
        keys = tuple(c.key for c in kept) + tuple(c.lead for c in kept if c.lead is not None)
        units.append(Unit(kept, {c.text: given[c.text] for c in kept}, (), keys))
    for batch in _batches(sorted(alone, key=lambda c: len(c.ids)), batch_size):
        units.append(Unit(tuple(batch), {c.text: given[c.text] for c in batch}, tuple(c.key for c in batch),
                          tuple(c.lead for c in batch)))
    return units


def _batches(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class Worker:
    """A Ray actor's body: one engine, the shared tier, and units run through the engine's Warmer."""

    def __init__(self, model: str, config: BlendConfig, store: str, threads: int, device: str = "cpu") -> None:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import torch

        from .engine import BlendEngine
        from .stores import compact, open_tier

        torch.set_num_threads(threads)
        self.engine = BlendEngine.from_pretrained(model, device=device, config=config)
        self.tier = open_tier(store, self.engine.kv.fingerprint, compact.codec_for(config.kv_dtype))

    def pid(self) -> int:
        return os.getpid()

    def plan(self, texts: list[str], batch_size: int) -> tuple[list[Unit], int, int, int]:
        """The units not fully stored yet, the distinct chunks, the records the corpus needs, and
        how many of those are stored."""
        units = plan_units(self.engine, texts, batch_size, list(self.tier.texts()))
        keys = [k for u in units for k in u.keys]
        stored = dict(zip(keys, self.tier.contains_many(keys)))
        todo = [u for u in units if not all(stored[k] for k in u.keys)]
        return todo, len({c.key for u in units for c in u.chunks}), len(keys), sum(stored.values())

    def run(self, unit: Unit, batch_size: int, worker: int) -> UnitDone:
        """Computes ``unit`` in a scratch memory tier and writes its records to the shared tier."""
        import torch

        from .stores import ChunkRecord, MemoryStore, StoreChain

        t = time.perf_counter()
        scratch = StoreChain(MemoryStore(1 << 62))
        scratch.memory.put_many([ChunkRecord(k, torch.empty(0), "") for k in unit.present])
        report = self.engine.kv.warmer.run(list(unit.chunks), scratch, None, given=unit.given, batch_size=batch_size,
                                        progress=False)
        records = scratch.memory.get_many(list(unit.keys))
        if any(r is None for r in records):  # a plan that does not match the Warmer: never store a part
            raise RuntimeError(f"unit computed {sum(r is not None for r in records)} of {len(records)} records")
        self.tier.put_many(records)
        stored = tuple(k for k, ok in zip(unit.keys, self.tier.contains_many(list(unit.keys))) if ok)
        return UnitDone(worker, os.getpid(), stored, report.computed, time.perf_counter() - t)


def warm_corpus(
    texts: Sequence[str], *, model: str | os.PathLike, store: str | os.PathLike,
    config: BlendConfig | None = None, options: RayWarmOptions | None = None,
) -> RayWarmReport:
    """Warms ``texts`` on Ray into ``store`` (a folder every worker reaches, or a shared tier's URL
    such as ``redis://host:6379/0``): records byte-identical to ``BlendEngine.warm(texts)`` in
    one process. Idempotent: what the store holds is not computed again. A worker that dies loses
    its unit in flight (``report.missing``); the others go on, and a re-run finishes the rest."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError("warming on Ray needs ray: pip install 'cacheblend[ray]'") from exc
    opts, config = options or RayWarmOptions(), config or BlendConfig()
    if opts.workers < 1 or opts.threads < 1 or opts.batch_size < 1:
        raise ValueError(f"workers, threads and batch_size must be >= 1, got {opts}")
    started = not ray.is_initialized()
    if started:
        if opts.address in (None, "local"):
            ray.init(num_cpus=opts.workers * opts.threads, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=opts.address)
    try:
        return _drive(ray, list(texts), str(model), _location(store), config, opts)
    finally:
        if started:
            ray.shutdown()


def _location(store: str | os.PathLike) -> str:
    from .stores.tier import is_shared_location

    return str(store) if is_shared_location(store) else str(Path(store).resolve())


def _drive(ray: Any, texts: list[str], model: str, store: str, config: BlendConfig, opts: RayWarmOptions) -> RayWarmReport:
    """Starts the actors, plans in the first, hands out units largest first, collects reports."""
    t = time.perf_counter()
    actor = ray.remote(num_cpus=opts.threads, max_restarts=0)(Worker)
    actors = [actor.remote(model, config, store, opts.threads, opts.device) for _ in range(opts.workers)]
    ray.get([a.pid.remote() for a in actors])
    load_s, t = time.perf_counter() - t, time.perf_counter()
    units, chunks, records, stored = ray.get(actors[0].plan.remote(texts, opts.batch_size))
    report = RayWarmReport(chunks, records, stored, per_worker=[0] * opts.workers, load_s=load_s)
    queue = deque(sorted(units, key=lambda u: -len(u.keys)))
    flight: dict[Any, tuple[int, Unit]] = {}

    def hand(i: int) -> None:
        if queue:
            unit = queue.popleft()
            flight[actors[i].run.remote(unit, opts.batch_size, i)] = (i, unit)

    for i in range(opts.workers):
        hand(i)
    while flight:
        [ref], _ = ray.wait(list(flight), num_returns=1)
        i, unit = flight.pop(ref)
        try:
            done = ray.get(ref)
        except ray.exceptions.RayActorError:  # the worker died: its unit is not stored (or not all of it)
            report.dead_workers.append(i)
            report.missing.extend(unit.keys)
            if len(report.dead_workers) == opts.workers:
                report.missing.extend(k for u in queue for k in u.keys)
                queue.clear()
            continue
        hand(i)  # the worker's next unit starts before this one is reported
        report.done.extend(done.keys)
        report.missing.extend(k for k in unit.keys if k not in set(done.keys))
        report.computed += done.computed
        report.per_worker[i] += done.computed
        if opts.on_report is not None:
            opts.on_report(done)
    report.warm_s = time.perf_counter() - t
    for a in actors:
        ray.kill(a)
    return report
