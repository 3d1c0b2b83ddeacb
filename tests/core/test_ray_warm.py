"""Warming a corpus on Ray (cacheblend.distributed): a local Ray of 2 CPUs started here on loopback,
a tiny random Llama saved as a folder (each actor loads its own engine), neighbours=1 with lead
records, fp32 KV (int8 or fp16 rounding could hide a 1e-7 difference). Every record two Ray
workers store is torch.equal to one in-process ``engine.warm`` of the same corpus; a worker
SIGKILLed mid-run loses nothing it reported, and a re-run finishes the rest with the same bytes."""

import os
import signal
from pathlib import Path

import pytest
import ray  # the ray extra (make installs it): a missing Ray fails here, never skips
import torch

from cacheblend import BlendConfig, BlendEngine
from cacheblend.distributed import RayWarmOptions, plan_units, warm_corpus
from cacheblend.stores import DiskStore

CONFIG = BlendConfig(neighbours=1, lead_alone=True, kv_dtype="float32")
TOPICS = ["harbour ships sail", "honey bees hives", "glacier ice melt", "violin strings bow", "comet orbit tail",
          "bread flour yeast", "river delta silt", "chess opening gambit"]
CORPUS = [f"Note {i}: the {TOPICS[i % 8]} " + " ".join(f"{w}{(i * 7 + j) % 11}" for j, w in
                                                     enumerate(TOPICS[i % 8].split() * (1 + i % 4)))
          for i in range(32)]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tmp_path_factory):
    """One process warming the corpus: its engine and every record it stored (key -> KV)."""
    engine = BlendEngine.from_pretrained(tiny_model_dir, device="cpu", config=CONFIG)
    folder = tmp_path_factory.mktemp("one-process")
    engine.warm(CORPUS, store_dir=folder, progress=False)
    return engine, _records(folder, engine.kv.fingerprint)


def _records(folder: Path, fingerprint: str) -> dict[str, torch.Tensor]:
    store = DiskStore(folder, fingerprint, "plain")
    keys = [p.name.removesuffix(".safetensors") for p in (store.dir / "kv").rglob("*.safetensors")]
    return {k: store.get(k).kv for k in keys}


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want)
    differ = [k for k in want if not torch.equal(got[k], want[k])]
    assert not differ, f"{len(differ)} of {len(want)} records differ from the one-process warm"


def test_the_plan_takes_lead_records_both_ways(reference):
    """The corpus exercises both lead paths: taken from a neighbour's forward, and alone in a
    padded batch of several chunks (the two that a naive shard warms differently)."""
    engine, want = reference
    units = plan_units(engine, CORPUS, 8)
    alone = [u for u in units if u.present]
    assert alone and max(len(u.chunks) for u in alone) >= 2
    assert any(c.lead is not None for u in units if not u.present for c in u.chunks)
    assert sorted(k for u in units for k in u.keys) == sorted(want)  # every record has one owner


def test_two_workers_store_what_one_process_stores(local_ray, reference, tiny_model_dir, tmp_path):
    engine, want = reference
    reports = []
    options = RayWarmOptions(workers=2, threads=1, on_report=reports.append)
    report = warm_corpus(CORPUS, model=tiny_model_dir, store=tmp_path, config=CONFIG, options=options)
    assert report.complete and report.chunks == len(CORPUS) and report.records == len(want)
    assert report.computed == len(want) and sum(report.per_worker) == len(want)
    assert all(n > 0 for n in report.per_worker)  # both workers did some of it
    assert len({r.pid for r in reports}) == 2 and os.getpid() not in {r.pid for r in reports}
    assert sorted(report.done) == sorted(want)
    _assert_same(_records(tmp_path, engine.kv.fingerprint), want)
    again = warm_corpus(CORPUS, model=tiny_model_dir, store=tmp_path, config=CONFIG, options=options)
    assert again.complete and again.computed == 0 and again.stored_before == len(want)  # idempotent


def test_a_killed_worker_loses_nothing_it_reported_and_a_rerun_finishes(local_ray, reference, tiny_model_dir, tmp_path):
    engine, want = reference
    killed = []

    def kill_after_first(done):
        if done.worker == 0 and not killed:  # its next unit was handed to it before this report
            killed.append(done.pid)
            os.kill(done.pid, signal.SIGKILL)

    options = RayWarmOptions(workers=2, threads=1, on_report=kill_after_first)
    first = warm_corpus(CORPUS, model=tiny_model_dir, store=tmp_path, config=CONFIG, options=options)
    assert killed and first.dead_workers == [0]
    assert not first.complete and first.missing and set(first.missing).isdisjoint(first.done)
    assert set(first.done) | set(first.missing) == set(want)
    store = DiskStore(tmp_path, engine.kv.fingerprint, "plain")
    for key in first.done:  # every reported record reads back, and is the one-process bytes
        record = store.get(key)
        assert record is not None and torch.equal(record.kv, want[key])
    rerun = warm_corpus(CORPUS, model=tiny_model_dir, store=tmp_path, config=CONFIG,
                        options=RayWarmOptions(workers=2, threads=1))
    assert rerun.complete and rerun.stored_before >= len(first.done)
    assert rerun.computed == len(set(first.missing))  # only the lost unit is computed again
    _assert_same(_records(tmp_path, engine.kv.fingerprint), want)


def test_a_redis_store_gets_the_same_records(local_ray, reference, tiny_model_dir, tmp_path):
    from cacheblend.stores import RedisStore
    from cacheblend.tools.local_redis import RedisServer

    engine, want = reference
    server = RedisServer(tmp_path / "redis").start()
    try:
        report = warm_corpus(CORPUS, model=tiny_model_dir, store=server.url, config=CONFIG,
                             options=RayWarmOptions(workers=2, threads=1))
        assert report.complete and report.computed == len(want)
        keys = sorted(want)
        got = RedisStore.from_url(server.url, engine.kv.fingerprint, "plain").get_many(keys)
        _assert_same({k: r.kv for k, r in zip(keys, got) if r is not None}, want)
    finally:
        server.stop()


def test_the_warm_command_on_ray(local_ray, tiny_model_dir, tmp_path, capsys):
    """``cacheblend warm SOURCE --dir IDX --ray ...``: the index is built here, the KV warmed by two
    actors into IDX's store; the same command again computes nothing."""
    import json

    from cacheblend.cli import main

    source = tmp_path / "corpus.jsonl"
    source.write_text("\n".join(json.dumps({"text": t}) for t in CORPUS[:12]))
    argv = ["warm", str(source), "--dir", str(tmp_path / "idx"), "--model", tiny_model_dir, "--device", "cpu",
            "--neighbours", "1", "--ray", "local", "--ray-workers", "2", "--ray-threads", "1"]
    assert main(argv) == 0
    assert "24 records computed on Ray (2 workers x 1 threads" in capsys.readouterr().out  # plain + lead each
    assert len(list((tmp_path / "idx" / "cacheblend").rglob("*.safetensors"))) == 24
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "0 records computed on Ray" in out and "24 of 24 already stored" in out
    assert main([*argv[:2], "--dir", str(tmp_path / "idx2"), "--model", tiny_model_dir, "--store", "x"]) == 2  # --store needs --ray
