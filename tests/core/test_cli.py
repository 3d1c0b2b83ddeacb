"""The ``cacheblend`` command end to end on the real model, each run in a new process."""

import json
import os
import subprocess
import sys
from dataclasses import asdict

import pytest

from cacheblend.config import BlendConfig

pytestmark = pytest.mark.real_model

DOCS = {
    "tides.txt": "The harbour of Brest sees tides of up to seven metres. Fishing boats leave at high water "
    "and return on the next tide, and the harbour master rings a bell one hour before low water.",
    "bells.txt": "The bell of the harbour church was recast in 1911 after a storm cracked it. It rings the "
    "hours from six in the morning until ten at night, and twice for every wedding.",
    "ferries.md": "Ferries to the islands leave from the north quay. In winter only the morning ferry "
    "runs, and it waits for the mail van from the station before casting off.",
}


def cacheblend(*args, cwd, stderr=False):
    """The command's stdout (and its stderr with ``stderr=True``); it must exit 0."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-m", "cacheblend.cli", *args], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return (out.stdout, out.stderr) if stderr else out.stdout


def test_warm_then_ask_then_warm_again_reuses_the_store(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in DOCS.items():
        (docs / name).write_text(text)
    first = cacheblend("warm", str(docs), "--dir", "idx", cwd=tmp_path)
    assert "3 chunks computed, 0 already stored" in first
    answer = cacheblend("ask", "When does the winter ferry leave?", "--dir", "idx", "--top-k", "3",
                        "--max-new-tokens", "8", "--compare", cwd=tmp_path)
    assert "chunks 3 hit, 0 missed" in answer and "full prefill: TTFT" in answer
    again = cacheblend("warm", str(docs), "--dir", "idx", cwd=tmp_path)
    assert "0 new passages" in again and "0 chunks computed, 3 already stored" in again
    lines = (tmp_path / "idx" / "passages.jsonl").read_text().splitlines()
    assert sorted(json.loads(x)["text"] for x in lines) == sorted(DOCS.values())


def test_bad_input_gives_a_clear_error_and_exit_code(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-m", "cacheblend.cli", "ask", "q", "--dir", "missing"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "holds no index" in out.stderr


def test_bench_writes_table_json_and_plot(tmp_path):
    # 8 answer tokens, not 32: the columns' plumbing is what is checked here (45.8 s -> 31.1 s)
    text, err = cacheblend("bench", "--prompts", "1", "--chunks", "2", "--repeats", "1", "--ratios", "0.15",
                           "--answer-tokens", "8", "--out", "b", cwd=tmp_path, stderr=True)
    assert "| cacheblend 15% |" in text and "| full prefill | 100.0% |" in text
    # each warming in its own folder: no store holding only the other's records, so no warning about one
    assert (tmp_path / "b" / "store").is_dir() and (tmp_path / "b" / "store-alone").is_dir()
    assert "StoreWarning" not in err, err[-2000:]
    saved = json.loads((tmp_path / "b" / "bench.json").read_text())
    rows = saved["rows"]
    # the config its "cacheblend" rows ran (at each ratio): the model's default, so a README table can be checked against it
    assert saved["meta"]["config"] == json.loads(json.dumps(asdict(BlendConfig.for_model(saved["meta"]["model"]))))
    by = {r["method"]: r for r in rows}
    alone = {"CacheBlend 15% (chunks warmed alone)", "EPIC chunk start 15% (alone)"}  # the default warms behind neighbours
    assert set(by) == {"full prefill", "prefix caching", "full reuse", "cacheblend 15%", "full reuse (chunks warmed alone)"} | alone
    assert by["full prefill"]["kl"] == 0 and by["full prefill"]["speedup"] == 1
    assert all(by[name]["recomputed_share"] == by["cacheblend 15%"]["recomputed_share"] for name in alone)
    assert by["full reuse"]["recomputed_share"] < by["cacheblend 15%"]["recomputed_share"] < 0.3
    assert by["full reuse (chunks warmed alone)"]["recomputed_share"] == by["full reuse"]["recomputed_share"]
    line = next(x for x in text.splitlines() if x.startswith("| cacheblend 15% |"))  # KL over both full reuses
    own, alone_kl = by["full reuse"]["kl"], by["full reuse (chunks warmed alone)"]["kl"]
    assert f"| {by['cacheblend 15%']['kl'] / own:.2f}x; {by['cacheblend 15%']['kl'] / alone_kl:.2f}x |" in line
    assert by["full prefill"]["mac_floor"] == 1 < by["cacheblend 15%"]["mac_floor"] < by["full reuse"]["mac_floor"]
    assert by["full prefill"]["of_floor"] == by["full prefill"]["of_mac_floor"] == 1
    blend = by["cacheblend 15%"]  # one prompt: the per-prompt ratios are the table's own
    assert blend["of_floor"] == pytest.approx(blend["speedup"] / blend["floor"])
    assert blend["of_mac_floor"] == pytest.approx(blend["speedup"] / blend["mac_floor"])
    per_prompt = blend["per_prompt"]
    assert len(per_prompt["ttft_s"]) == len(per_prompt["macs"]) == len(per_prompt["rows"]) == 1
    assert blend["floor"] == pytest.approx(by["full prefill"]["per_prompt"]["rows"][0] / per_prompt["rows"][0])
    assert (tmp_path / "b" / "bench.png").stat().st_size > 10_000


def test_bench_floor_ratio_is_per_prompt_not_medians_over_mean_share():
    """An auto budget recomputes 5% of one prompt and 25% of another. If each runs exactly at its
    own floor, the method is at its floor: 1.0, though the median TTFT over the floor at the mean
    share says otherwise."""
    from cacheblend.tools.bench import MethodResult, compute_floor

    layers, tokens = 24, 1000
    full = MethodResult("full prefill", 1.0, ttft_s=[10.0] * 3, macs=[100] * 3, rows=[layers * tokens] * 3)
    shares = [0.05, 0.25, 0.25]
    floors = [compute_floor(layers, 1, s) for s in shares]
    auto = MethodResult("auto", None, ttft_s=[10.0 / f for f in floors], macs=[100 / f for f in floors],
                        rows=[tokens * (1 + (layers - 1) * s) for s in shares],  # layer 0 over every token
                        recomputed_share=shares, load_s=[0.0] * 3, kl=[0.0] * 3, f1_full=[1.0] * 3)
    row = auto.summary(full)
    assert row["of_floor"] == pytest.approx(1.0) and row["of_mac_floor"] == pytest.approx(1.0)
    assert row["speedup"] / row["floor"] < 0.9  # the old reading: the median prompt (25%), the mean share's floor


def test_bench_methods_keep_cacheblend_deviation_and_add_an_auto_engines_own_budget(make_engine):
    """With an engine whose default is the named chunk's budget (Qwen's catalogue choice), the bench
    still runs CacheBlend with its own selector (deviation, chunks alone) and adds the engine's
    per-request budget as "cacheblend auto"; fixed ratios keep the engine's selector."""
    from cacheblend.tools.bench import methods

    engine = make_engine(selector="lexical", auto_budget=True, auto_signal="named_share", neighbours=1)
    table = methods(engine, (0.15,), baseline=make_engine())
    assert table["CacheBlend 15% (chunks warmed alone)"][0].selector == "deviation"
    assert table["EPIC chunk start 15% (alone)"][0].selector == "chunk_start"
    assert table["cacheblend auto"][0] == engine.config
    fixed = table["cacheblend 15%"][0]
    assert (fixed.selector, fixed.auto_budget, fixed.recompute_ratio) == ("lexical", False, 0.15)
    assert "cacheblend auto" not in methods(make_engine(), (0.15,))
    for name in ("full reuse", "full reuse (chunks warmed alone)"):  # ratio 0: no per-request budget either
        reuse = table[name][0]
        assert (reuse.ratios, reuse.auto_budget, reuse.recompute_ratio) == ((0.0,), False, 0.0), name
