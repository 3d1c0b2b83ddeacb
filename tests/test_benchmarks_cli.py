"""Every benchmark script: ``--help`` exits without work, ``--quick`` runs end to end and writes a run
file that names its command, commit, date, model and machine load; benchmarks/figures.py finds a
committed run file for every figure marker (benchmarks/README.md has the convention).

The quick runs use the tiny random Llama (``tiny_model_dir``, passed with ``--model``: the
default model is the bundled one, which test_default_model_is_the_engines checks), so they take
seconds each; they prove each script runs end to end, not its figures.
"""

import importlib
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name != "runfile.py")  # runfile.py: the shared module
NO_MODEL = {"frontier.py", "figures.py", "gate_eval.py"}  # they run no model
NO_GIT = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode != 0


def _env() -> dict:
    path = os.pathsep.join([str(BENCH), str(ROOT / "core"), os.environ.get("PYTHONPATH", "")])
    return os.environ | {"PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _run(args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)


def test_runfile_is_the_only_module_and_every_script_is_listed_in_the_readme():
    readme = (BENCH / "README.md").read_text()
    missing = [s for s in [*SCRIPTS, "gpu_check.sh"] if f"`{s}`" not in readme]
    assert not missing, f"benchmarks/README.md does not describe {missing}"
    assert "__main__" not in (BENCH / "runfile.py").read_text()


_HELPS = """
import contextlib, io, json, runpy, sys, traceback
out = {}
for path in sys.argv[1:]:
    sys.argv = [path, "--help"]
    stdout, stderr, code = io.StringIO(), io.StringIO(), None
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as exc:
            code = exc.code
        except Exception:  # this script fails alone, with its traceback
            code = traceback.format_exc()
    out[path] = [code, stdout.getvalue(), stderr.getvalue()]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def helps() -> dict[str, list]:
    """Every script's ``--help`` as ``python benchmarks/X.py --help`` runs it, all in one fresh
    interpreter (torch and transformers imported once, not once per script): name -> [exit code
    (None: it returned without exiting), stdout, stderr]."""
    proc = _run([sys.executable, "-c", _HELPS, *(str(BENCH / s) for s in SCRIPTS)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {Path(k).name: v for k, v in json.loads(proc.stdout.splitlines()[-1]).items()}


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_exits_before_any_work(script, helps):
    code, stdout, stderr = helps[script]
    assert code == 0, f"{code}\n{stderr}"
    assert stdout.startswith("usage:") and "--quick" in stdout
    assert ("--model" in stdout) == (script not in NO_MODEL)
    assert "Loading weights" not in stderr  # no model was loaded


def test_gpu_check_help_and_bad_option():
    proc = _run(["bash", str(BENCH / "gpu_check.sh"), "--help"], timeout=30)
    assert proc.returncode == 0 and "--quick" in proc.stdout and "--model" in proc.stdout, proc.stderr
    assert not (ROOT / "gpu_check_results.txt").exists()  # --help ran nothing
    bad = _run(["bash", str(BENCH / "gpu_check.sh"), "--no-such-option"], timeout=30)
    assert bad.returncode == 2 and "unknown option" in bad.stderr


def test_default_model_is_the_engines():
    sys.path.insert(0, str(BENCH))
    try:
        from runfile import DEFAULT_MODEL
    finally:
        sys.path.remove(str(BENCH))
    from cacheblend.models.bundled import ALIAS

    assert DEFAULT_MODEL == ALIAS


class QuickRun(NamedTuple):
    """A finished quick run: its run file's contents and the folder it wrote in (``{dir}`` in its
    arguments)."""

    data: dict
    dir: Path


def quick(script: str, *extra: str, model: bool = True):
    """Marks a test that reads ``script``'s quick run (``--quick --run-file DIR/run.json`` and
    ``extra``, ``{dir}`` in them standing for DIR; ``--model`` the tiny Llama unless ``model`` is
    false): the ``quick_run`` fixture hands the test that run, checked."""
    return pytest.mark.quick_run(script, *extra, model=model)


def _spec(mark) -> tuple:
    return (mark.args[0], tuple(mark.args[1:]), mark.kwargs.get("model", True))


def _launch(spec: tuple, folder: Path, tiny_model: str) -> subprocess.CompletedProcess:
    script, extra, model = spec
    args = [sys.executable, str(BENCH / script), "--quick", "--run-file", str(folder / "run.json")]
    args += [a.replace("{dir}", str(folder)) for a in extra]
    return _run(args + (["--model", tiny_model] if model else []))


@pytest.fixture(scope="module")
def quick_runs(request, tmp_path_factory, tiny_model_dir):
    """The quick runs of this module's selected tests (``@quick``), all started when the first is
    asked for and run two at a time, in the tests' order: spec -> (future of the finished
    process, its folder). Each run is one interpreter on one torch thread
    (``OMP_NUM_THREADS=1``), so one at a time left a core idle; two at a time they take about half
    as long (docs/runs/ci_suite.json). The scripts share no file: each writes in its own folder,
    and those that need more (a git worktree, a store, a server) make their own."""
    specs = []
    for item in request.session.items:
        mark = item.get_closest_marker("quick_run")
        skipped = any(m.args and m.args[0] is True for m in item.iter_markers("skipif"))
        if mark is not None and not skipped and item.module is request.module and _spec(mark) not in specs:
            specs.append(_spec(mark))
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = {}
        for spec in specs:
            folder = tmp_path_factory.mktemp(f"quick-{spec[0][:-3]}")
            runs[spec] = (pool.submit(_launch, spec, folder, tiny_model_dir), folder)
        yield runs
        for future, _ in runs.values():
            future.cancel()  # those of tests that stopped before reading them


@pytest.fixture
def quick_run(request, quick_runs, tiny_model_dir) -> QuickRun:
    """This test's quick run (its ``@quick`` mark), finished, its exit code and run file checked: the
    run file names its command, commit, date, model and machine load."""
    spec = _spec(request.node.get_closest_marker("quick_run"))
    future, folder = quick_runs[spec]
    proc = future.result()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((folder / "run.json").read_text())
    run = data["run"]
    script, _, model = spec
    assert run["command"].startswith(f"python benchmarks/{script} --quick --run-file ")
    assert run["commit"] is None or re.fullmatch(r"[0-9a-f]{40}", run["commit"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", run["date"])
    assert run["machine"]["cpu_count"] == os.cpu_count()
    assert len(run["machine"]["load_start"]) == 3 and len(run["machine"]["load_end"]) == 3
    if model:
        assert run["model"] == tiny_model_dir
    return QuickRun(data, folder)


@quick("facts.py")
def test_facts_quick(quick_run):
    data = quick_run.data
    rows = {r["setting"]: r for r in data["rows"]}
    assert data["questions"] == 2 and len(rows) == 4
    assert rows["full prefill"]["mean_kl"] == 0.0
    for r in rows.values():
        assert 0 <= r["kept"] <= min(r["correct"], rows["full prefill"]["correct"])
    assert rows["full reuse (alone)"]["mean_kl"] > 0


@quick("exact_prompts.py")
def test_exact_prompts_quick(quick_run, tiny_model_dir):
    data = quick_run.data
    assert [r["family"] for r in data["rows"]] == ["llama3_1", f"{tiny_model_dir} (real)"]
    for r in data["rows"]:
        assert r["identical"] and all(r["identical"].values()), r
        assert 0.9 <= r["reused_langchain"] <= 1.0 and 0.9 <= r["reused_llamaindex"] <= 1.0


@quick("draft_verify.py")
def test_draft_verify_quick(quick_run):
    """The same prefill decoded with its draft verified and without: the same tokens, the
    verified picks counted within the answer (the quick run drafts 8 tokens: selector 'draft')."""
    data = quick_run.data
    assert data["summary"]["prompts"] == len(data["prompts"]) == 2 and "selector='draft'" in data["config"]
    for r in data["prompts"]:
        assert r["drafted"] == 8 and r["same_tokens"] and 0 <= r["verified"] <= r["answer_tokens"] <= 64, r
        assert r["decode_s"]["verified"] > 0 and r["decode_s"]["plain"] > 0
    assert data["summary"]["same_tokens"] == 2


@quick("store_bench.py")
def test_store_bench_quick(quick_run):
    res = quick_run.data["results"]
    assert set(res) == {"float16", "int8"}
    assert res["int8"]["bytes_per_token"] < 0.6 * res["float16"]["bytes_per_token"]


@quick("select_eval.py")
def test_select_eval_quick(quick_run):
    data = quick_run.data
    assert data["meta"]["count"] == 1 and set(data["methods"]) == {"full prefill", "reuse", "deviation"}
    assert data["methods"]["reuse"]["share"] < data["methods"]["deviation"]["share"] < 1.0
    rows = data["questions"]  # per question, what gate_eval.py reads: the blend's confidence among them
    assert set(rows) == set(data["methods"]) and all(len(r["margin"]) == 1 for r in rows.values())
    assert all(0.0 <= r["margin_min"][0] <= r["margin"][0] <= 1.0 for r in rows.values())
    full = rows["full prefill"]["answer"][0]  # each method's answer text, and "same answer" agrees with it
    assert all(r["agree"][0] == (r["answer"][0] == full) for r in rows.values())


def test_select_eval_knob_methods_add_one_field_to_a_known_method():
    select_eval = _bench_module("select_eval")
    assert select_eval.knob_method("nb1 deviation spread 0.25") and select_eval.knob_method("nb1 reuse doubt 0.01")
    config, selector = select_eval.METHODS["nb1 deviation spread 0.25"]
    assert (config.spread, selector) == (0.25, None)
    assert config == replace(select_eval.METHODS["nb1 deviation"][0], spread=0.25)
    assert select_eval.METHODS["nb1 reuse doubt 0.01"][0].doubt_margin == 0.01
    # a selector object is kept by spread (its blend reads the config's spread); doubt refuses it
    assert select_eval.knob_method("nb1 oracle spread 0.5") and not select_eval.knob_method("nb1 oracle doubt 0.1")
    assert select_eval.METHODS["nb1 oracle spread 0.5"][1] is select_eval.METHODS["nb1 oracle"][1]
    assert not select_eval.knob_method("no such method spread 0.25") and not select_eval.knob_method("nb1 deviation")
    # knobs compose, the last outermost: the gated lead records of Qwen's default (docs/LEXICAL-SELECTOR.md)
    assert select_eval.knob_method("nb1 lexical+question 8% lead 0.5 margin 0.3")
    base = select_eval.METHODS["nb1 lexical+question 8%"][0]
    gated = select_eval.METHODS["nb1 lexical+question 8% lead 0.5 margin 0.3"][0]
    assert gated == replace(base, lead_after_named=0.5, lead_after_margin=0.3)
    assert select_eval.METHODS["nb1 lexical+question 8% lead 0.5"][0] == replace(base, lead_after_named=0.5)
    assert not select_eval.knob_method("nb1 lexical+question 8% margin 0.3 lead")  # no value for the last


def test_restart_depth_through_takes_a_one_pass_method_at_a_fixed_ratio():
    """``"<base> through@D"`` is the base's product config with a last check layer at D keeping no
    reused row; a two-stage selector, an adaptive budget or a depth not past the check layers is refused."""
    select_eval, restart_depth = _bench_module("select_eval"), _bench_module("restart_depth")
    deviation = select_eval.METHODS["nb1 deviation"][0]
    assert restart_depth.through(deviation, 12) == replace(deviation, check_layers=(1, 12), ratios=(0.15, 0.0))
    assert restart_depth.through(deviation, 12).schedule() == {1: 0.15, 12: 0.0}
    for name in ("nb1 question", "nb1 lexical+question 8%", "nb1 lexical named"):
        with pytest.raises(SystemExit, match="one-pass method at a fixed ratio"):
            restart_depth.through(select_eval.METHODS[name][0], 12)
    with pytest.raises(SystemExit, match="after the check layers"):
        restart_depth.through(deviation, 1)


@quick("key_temperature.py")
def test_key_temperature_quick(quick_run):
    data = quick_run.data
    methods = data["methods"]
    assert set(methods) == {"full prefill", "nb1 reuse", "nb1 reuse t0.9"}
    assert methods["nb1 reuse t0.9"]["share"] == methods["nb1 reuse"]["share"]  # the same rows recomputed
    assert methods["nb1 reuse t0.9"]["kl"] != methods["nb1 reuse"]["kl"]  # the temperature reached the blend


@quick("restart_depth.py")
def test_restart_depth_quick(quick_run):
    """Restarting every chunk but the named one at the last layer adds row-layers to the question
    selector's blend; deviation's selected rows (checked at layer 0) recomputed through layer 0 only
    (``through@1``) cost fewer row-layers than through every layer, keep only the uncached rows to
    the last layer, and are another blend."""
    methods = quick_run.data["methods"]
    assert set(methods) == {"full prefill", "nb1 question", "nb1 question + restart others@-1", "nb1 deviation at0",
                            "nb1 deviation at0 through@1"}
    assert methods["nb1 question + restart others@-1"]["row_layers"] > methods["nb1 question"]["row_layers"]
    base, through = methods["nb1 deviation at0"], methods["nb1 deviation at0 through@1"]
    assert through["row_layers"] < base["row_layers"] - 0.05
    assert through["share"] < base["share"] - 0.05  # the rows computed through the last layer: the uncached ones
    assert through["kl"] != base["kl"]


@quick("named_after.py")
def test_named_after_quick(quick_run):
    """The first development question names its fourth passage (of six): recomputing it and the
    two after it, whole, recomputes more than the named chunk alone, from the same records; reading
    the lead records of those two recomputes as much and changes the blend."""
    data = quick_run.data
    methods = data["methods"]
    assert set(methods) == {"full prefill", "nb1 lexical named", "nb1 named after", "nb1 named lead after"}
    assert methods["nb1 named after"]["share"] > methods["nb1 lexical named"]["share"] > 0.05
    # the same rows recomputed over other records (the two chunks after the named one: lead records)
    assert methods["nb1 named lead after"]["share"] == methods["nb1 lexical named"]["share"]
    assert methods["nb1 named lead after"]["kl"] != methods["nb1 lexical named"]["kl"]
    proc = _run([sys.executable, str(BENCH / "named_after.py"), "--by-target", str(quick_run.dir / "run.json")])
    rows, right = data["questions"], data["questions"]["full prefill"]["right"]
    lost = [sum(1 for r, m in zip(right, rows[name]["right"]) if r and not m) for name in list(methods)[1:]]
    assert proc.returncode == 0 and f"| all | {sum(map(bool, right))} | " + " | ".join(map(str, lost)) + " |" in proc.stdout
    assert "| 4 of 6 |" in proc.stdout or not any(right)  # the question's answer is in its fourth passage


@quick("repair_ablation.py")
def test_repair_ablation_quick(quick_run):
    """The quick run ablates its one question whether lost or not: each set recomputes the passages it
    names (a set holding another's recomputes more), and recomputing every passage is a full prefill:
    every row recomputed, full prefill's answer to the token."""
    data = quick_run.data
    (case,) = data["cases"]
    tried = {a["label"]: a for a in case["ablations"]}
    others = [j for j in range(case["passages"]) if j != case["target"]]
    assert set(tried) == {"answer", "all but answer", "all", *(f"answer + {j}" for j in others),
                          *(f"all but {j}" for j in others)}
    assert tried["all"]["share"] == 1.0 and tried["all"]["answer"] == case["full"] and tried["all"]["same_as_full"]
    for j in others:
        assert tried["answer"]["share"] < tried[f"answer + {j}"]["share"] < tried["all"]["share"]
        assert tried[f"all but {j}"]["share"] < 1.0
    assert data["summary"]["every passage"]["repaired"] == int(tried["all"]["right"])


@quick("named_plus.py")
def test_named_plus_quick(quick_run):
    """The named chunk plus 2% of the reused tokens by deviation among the others: the named chunk's
    rows and at most 2 points of the prompt more (the reused tokens are part of it), a changed blend."""
    data = quick_run.data
    methods = data["methods"]
    assert set(methods) == {"full prefill", "nb1 lexical named", "nb1 named +2%"}
    more = methods["nb1 named +2%"]["share"] - methods["nb1 lexical named"]["share"]
    assert 0 < more <= 0.02 + 1e-9
    assert methods["nb1 named +2%"]["kl"] != methods["nb1 lexical named"]["kl"]


@quick("named_ties.py", "--tally")
def test_named_ties_quick(quick_run):
    """Three development fact questions, tokenized only: one score per chunk, the ties the scores
    say, and the count of them in the run's meta."""
    data = quick_run.data
    prompts = data["prompts"]
    assert len(prompts) == 3 and all(len(p["scores"]) == 6 for p in prompts)
    for p in prompts:
        best = max(p["scores"])
        top = [i for i, s in enumerate(p["scores"]) if s == best]
        assert p["tied"] == (top if best > 0 and len(top) > 1 else [])
    assert data["meta"]["ties"] == sum(bool(p["tied"]) for p in prompts)
    assert any(max(p["scores"]) > 0 for p in prompts)  # the fact questions name their passage


def _bench_module(name: str):
    """A benchmark script imported as a module (benchmarks/ is not a package)."""
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))


def _three_chunks(ids: torch.Tensor, fresh_v: torch.Tensor, question: list[int]):
    """Candidates of three 100-token chunks whose cached K, V and fresh K are 0: V deviation is
    ``fresh_v``'s."""
    from cacheblend.blending.selection import Candidates

    zeros = torch.zeros_like(fresh_v)
    return Candidates(layer=1, fresh_k=zeros, fresh_v=fresh_v, cached_k=zeros, cached_v=zeros,
                      positions=torch.arange(300), chunk_offsets=torch.arange(300) % 100, ids=ids,
                      question_ids=torch.tensor(question))


@quick("named_ties.py")
def test_named_ties_blend_quick(quick_run):
    """One development fact question, which names one passage (no tie): the tie-breaks recompute
    the product's rows, and their blends are the product's to the last digit."""
    methods = quick_run.data["methods"]
    assert set(methods) == {"full prefill", "nb1 lexical named", "nb1 named ties first", "nb1 named ties none"}
    product = methods["nb1 lexical named"]
    assert product["share"] > 0.05
    for name in ("nb1 named ties first", "nb1 named ties none"):
        assert methods[name]["share"] == product["share"] and methods[name]["kl"] == product["kl"]


def test_named_ties_breaks_a_tie_first_none_or_all():
    """Three chunks of 100 tokens; the question's two rare ids are in chunks 0 and 2 (a tie). The
    product names the first (``named_chunk``); the script's tie-breaks take the first, the last, none (5% by
    deviation, the 15 most deviating tokens: chunk 1's here), both, or the one whose tokens deviate
    most on average; with the first chunk read alone, "first" names none, "all" and "deviation" the
    last alone."""
    NamedTie = _bench_module("named_ties").NamedTie
    from cacheblend.blending.lexical import chunk_scores, named_chunk
    from cacheblend.blending.selection import Candidates

    n = 300
    ids = torch.full((n,), 5)
    ids[10], ids[250] = 7, 8
    v = torch.zeros(2, n, 4)
    v[:, 100:115] = 1.0  # chunk 1's first 15 tokens deviate most
    cand = _three_chunks(ids, v, [7, 8])
    chunk = torch.arange(n) // 100
    assert named_chunk(chunk_scores(ids, chunk, cand.question_ids)) == 0
    assert sorted(NamedTie("first")(cand, 0).tolist()) == list(range(100))
    assert sorted(NamedTie("last")(cand, 0).tolist()) == list(range(200, 300))
    assert sorted(NamedTie("none")(cand, 0).tolist()) == list(range(100, 115))
    assert sorted(NamedTie("all")(cand, 0).tolist()) == [*range(100), *range(200, 300)]
    assert sorted(NamedTie("deviation")(cand, 0).tolist()) == list(range(200, 300))  # neither deviates: the last
    alone = Candidates(**{**cand.__dict__, "first_alone": True})
    assert sorted(NamedTie("first")(alone, 0).tolist()) == list(range(100, 115))
    assert sorted(NamedTie("all")(alone, 0).tolist()) == sorted(NamedTie("last")(alone, 0).tolist()) == list(range(200, 300))
    v[:, 5:10] = 1.0
    assert sorted(NamedTie("deviation")(cand, 0).tolist()) == list(range(100))  # chunk 0 deviates more
    assert sorted(NamedTie("deviation")(alone, 0).tolist()) == list(range(200, 300))
    with pytest.raises(ValueError, match="ties"):
        NamedTie("middle")


def test_attention_chunk_names_by_the_question_stage_one_mass():
    """Three chunks of 100 tokens; the question's two rare ids are in chunks 0 and 2 (a tie) and
    stage 1's question mass is highest on chunk 1, then chunk 0, then chunk 2. "ties" breaks the
    tie by mass (chunk 0; chunk 2 with the first chunk read alone), "chunk" takes the chunk read
    most (chunk 1), "chunk+named" that and the lexical choice, "named" the product's named chunk
    (the first tied; none with the first read alone: then, with a floor, the floor's share by the
    stage-1 score); a question naming no chunk gets 5% by V deviation (15 tokens) without a floor;
    with no question score it refuses."""
    AttentionChunk = _bench_module("attention_chunk").AttentionChunk
    from cacheblend.blending.selection import Candidates

    n = 300
    ids = torch.full((n,), 5)
    ids[10], ids[250] = 7, 8
    score = torch.full((n,), 0.001)
    score[100:110], score[0:5] = 0.5, 0.4  # chunk 1 (5.0 + 0.09) over chunk 0 (2.0 + 0.095) over chunk 2 (0.1)
    cand = Candidates(**{**_three_chunks(ids, torch.zeros(2, n, 4), [7, 8]).__dict__, "question_score": score})
    alone = Candidates(**{**cand.__dict__, "first_alone": True})
    assert sorted(AttentionChunk("ties")(cand, 0).tolist()) == list(range(100))
    assert sorted(AttentionChunk("ties")(alone, 0).tolist()) == list(range(200, 300))
    assert sorted(AttentionChunk("chunk")(cand, 0).tolist()) == list(range(100, 200))
    assert sorted(AttentionChunk("chunk+named", "all")(cand, 0).tolist()) == list(range(200))
    assert sorted(AttentionChunk("chunk+named")(alone, 0).tolist()) == list(range(100, 300))
    assert sorted(AttentionChunk("named")(cand, 0).tolist()) == list(range(100))  # the product's: the first tied
    assert sorted(AttentionChunk("named", floor=0.05)(alone, 0).tolist()) == [*range(5), *range(100, 110)]
    score[200:300] = 1.0  # chunk 2 now read most
    assert sorted(AttentionChunk("chunk")(alone, 0).tolist()) == list(range(200, 300))
    v = torch.zeros(2, n, 4)
    v[:, 140:155] = 1.0
    no_name = Candidates(**{**alone.__dict__, "fresh_v": v, "question_ids": torch.tensor([9])})
    assert sorted(AttentionChunk("ties")(no_name, 0).tolist()) == list(range(140, 155))  # 5% by V deviation
    with pytest.raises(ValueError, match="two-stage"):
        AttentionChunk("chunk")(_three_chunks(ids, torch.zeros(2, n, 4), [7, 8]), 0)
    with pytest.raises(ValueError, match="how"):
        AttentionChunk("middle")


def test_named_plus_picks_the_named_chunk_whole_then_deviation_where_asked():
    """Three chunks of 100 tokens; the question's rare id is in chunk 1 only. The named chunk
    comes whole, then 2% (6 tokens) by V deviation: the most deviating of chunks 0 and 2 (all six
    in chunk 0 here), or with ``within=2`` those of chunk 2 alone."""
    NamedPlusDeviation = _bench_module("named_plus").NamedPlusDeviation

    n = 300
    ids = torch.full((n,), 5)
    ids[150] = 7  # the question's name, in chunk 1
    fresh = torch.zeros(2, n, 4)
    deviating = [3, 10, 20, 30, 40, 50, 220, 230, 240, 250, 260, 270]  # in chunks 0 and 2, most first
    fresh[:, deviating, :] = torch.arange(12, 0, -1.0)[None, :, None]
    cand = _three_chunks(ids, fresh, [7, 5])
    named = set(range(100, 200))
    assert set(NamedPlusDeviation(0.02)(cand, 100).tolist()) == named | {3, 10, 20, 30, 40, 50}
    assert set(NamedPlusDeviation(0.02, within=2)(cand, 100).tolist()) == named | set(deviating[6:])


def test_named_windows_recompute_the_named_chunk_and_the_question_tokens_surroundings():
    """Three chunks of 100 tokens; the question names chunk 1 (its rare id 7), and asks with id 9,
    which chunks 0 and 2 hold (at 20, and at 250 and 299); id 5 fills every chunk (common). Width 2:
    the named chunk whole and 248-252 and 297-299 (a window stops at its chunk's end); every other
    chunk adds 18-22. The deviation control adds as many of chunk 2's most deviating tokens, and
    "within" keeps the named chunk's size: the windows, then its most deviating tokens."""
    NamedWindows = _bench_module("named_after").NamedWindows

    ids = torch.full((300,), 5)
    ids[150], ids[[20, 250, 299]] = 7, 9
    fresh = torch.zeros(2, 300, 4)
    fresh[:, [200, 201, 202, 150, 151], :] = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])[None, :, None]
    cand = _three_chunks(ids, fresh, [7, 9, 5])
    named, after = set(range(100, 200)), {248, 249, 250, 251, 252, 297, 298, 299}
    assert set(NamedWindows(2)(cand, 100).tolist()) == named | after
    assert set(NamedWindows(2, after_only=False)(cand, 100).tolist()) == named | after | {18, 19, 20, 21, 22}
    control = NamedWindows(2, mode="deviation")(cand, 100).tolist()
    assert len(control) == 108 and set(control) >= named | {200, 201, 202}
    assert all(100 <= i for i in control)  # nothing from the chunk before the named one
    within = NamedWindows(2, mode="within")(cand, 100).tolist()
    assert len(within) == 100 and set(within) >= after | {150, 151}
    with pytest.raises(ValueError, match="mode"):
        NamedWindows(2, mode="random")


def test_named_after_lost_says_where_each_lost_value_comes_from():
    """``--lost`` sorts a method's lost answers by the passage their value comes from: the answer's
    own passage first (values such as emblems repeat across entities), then the earliest other
    holder; on a committed run its counts add up to the answers the method loses."""
    sys.path.insert(0, str(BENCH))
    from named_after import SOURCES, value_source

    passages = ["The A Guild is based in the city of Ashby. Its emblem is a fox.",
                "The B Guild was founded in 1801. Its emblem is a fox.",
                "The C Guild is based in the city of Corby."]
    values = {"Ashby", "Corby", "1801", "fox", "Dunby"}
    assert value_source("It is in Corby", passages, 1, values) == SOURCES[1]
    assert value_source("It is in Ashby", passages, 1, values) == SOURCES[0]
    assert value_source("founded in 1801", passages, 1, values) == SOURCES[2]
    assert value_source("a fox", passages, 1, values) == SOURCES[2]  # the answer's passage holds it too
    assert value_source("a fox", passages, 2, values) == SOURCES[0]
    assert value_source("in Dunby, or Ashbyton", passages, 1, values) == SOURCES[3]  # word-bounded
    run = ROOT / "docs" / "runs" / "named_lead_after_dev_qwen.json"
    proc = _run([sys.executable, str(BENCH / "named_after.py"), "--lost", str(run)])
    rows = json.loads(run.read_text())["questions"]
    right = rows["full prefill"]["right"]
    for name in (m for m in rows if m != "full prefill"):
        line = next(x for x in proc.stdout.splitlines() if x.startswith(f"| {name} |"))
        counts = [int(c) for c in line.strip("|").split("|")[1:]]
        assert counts[0] == sum(1 for r, m in zip(right, rows[name]["right"]) if r and not m) == sum(counts[1:])


def test_named_after_gate_takes_the_lead_rows_where_the_named_chunk_leads_by_the_margin(tmp_path):
    """``--gate``: per question the LEAD method's row where the prompt's named chunk leads the next
    chunk by at least M of its score, BASE's elsewhere. A tie leads by 0 (it takes LEAD's rows at
    M = 0 only, as ``lead_after_named`` alone does); a prompt naming none, or whose best chunk is
    the first (read alone: named by none), never does."""
    scores = [[0, 4, 1, 0], [0, 2, 2, 0], [0, 0, 0, 0], [3, 1, 0, 0], [0, 1, 0, 0], [0, 5, 0, 4]]
    # margins: 0.75, a tie (0), none, the first, 1, 0.2
    (tmp_path / "tally.json").write_text(json.dumps({"prompts": [{"index": 10 + i, "scores": s} for i, s in enumerate(scores)]}))
    q = lambda right, kl: {"right": right, "agree": [r > 0 for r in right], "f1": right, "kl": kl}  # noqa: E731
    rows = {"full prefill": q([1.0] * 6, [0.0] * 6), "b": q([0.0] * 6, [0.5] * 6), "l": q([1.0] * 6, [0.1] * 6)}
    (tmp_path / "run.json").write_text(json.dumps({"meta": {"start": 10}, "questions": rows}))
    proc = _run([sys.executable, str(BENCH / "named_after.py"), "--gate", str(tmp_path / "run.json"),
                 str(tmp_path / "tally.json"), "b", "l"])
    assert proc.returncode == 0, proc.stderr
    table = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in proc.stdout.splitlines()[2:]}
    assert table["0.0"] == ["4", "4", "4", "0.667", "0.2333"]
    assert table["0.2"] == ["3", "3", "3", "0.500", "0.3000"]
    assert table["0.3"] == table["0.7"] == ["2", "2", "2", "0.333", "0.3667"]
    assert table["(b)"] == ["0", "0", "0", "0.000", "0.5000"]
    (tmp_path / "run.json").write_text(json.dumps({"meta": {"start": 12}, "questions": rows}))  # past the tally
    assert _run([sys.executable, str(BENCH / "named_after.py"), "--gate", str(tmp_path / "run.json"),
                 str(tmp_path / "tally.json"), "b", "l"]).returncode != 0


@quick("gate_eval.py", model=False)
def test_gate_eval_quick_and_its_policies(quick_run):
    """gate_eval.py reads select_eval run files. A gate that escalates nothing is its base, one
    that escalates everything costs both passes and answers as the escalation; the AUC counts ties half."""
    data = quick_run.data
    assert data["fitted_on"].endswith("docs/runs/gate_dev.json") and data["runs"]
    sys.path.insert(0, str(BENCH))
    try:
        from gate_eval import auc, gate
    finally:
        sys.path.remove(str(BENCH))
    rows = {"full prefill": {"right": [1.0, 1.0, 0.0], "agree": [True] * 3, "kl": [0.0] * 3, "share": [1.0] * 3,
                             "margin": [0.9] * 3, "margin_min": [0.9] * 3, "f1": [1.0] * 3},
            "b": {"right": [0.0, 1.0, 0.0], "agree": [False, True, True], "kl": [0.3, 0.1, 0.1], "share": [0.2] * 3,
                  "margin": [0.1, 0.8, 0.5], "margin_min": [0.1, 0.6, 0.5], "f1": [0.0, 1.0, 1.0]}}
    rows["nb1 reuse"] = dict(rows["b"], share=[0.1] * 3)
    none, low, every = (gate(rows, "b", "full prefill", t) for t in (0.0, 0.3, 2.0))
    assert (none["kept"], none["agree"], none["share"]) == (1, 2, 0.2)
    assert (low["kept"], low["agree"], low["escalated"]) == (2, 3, 1 / 3)
    assert abs(low["share"] - (0.2 + 1 / 3)) < 1e-9 and abs(low["reused_share"] - 13 / 27) < 1e-9  # (1.1 + .1 + .1) / .9 / 3
    assert (every["kept"], every["agree"], every["kl"]) == (2, 3, 0.0)
    assert auc([0.9, 0.1], [True, False]) == 1.0 and auc([0.5, 0.5], [True, False]) == 0.5
    assert auc([1.0], [True]) is None
    # --choose: the escalation's draft margin picks one method per request, which costs its own share
    rows["e"] = dict(rows["full prefill"], share=[0.4] * 3, draft_margin=[0.02, 0.5, 0.04])
    chose = gate(rows, "b", "e", 0.05, "draft_margin", choose=True)
    assert (chose["escalated"], chose["kept"], chose["agree"]) == (2 / 3, 2, 3)  # requests 1 and 3 run e
    assert abs(chose["share"] - 1.0 / 3) < 1e-9 and abs(chose["kl"] - 0.1 / 3) < 1e-9  # (.4 + .2 + .4) / 3
    assert chose["f1"] == 1.0 and abs(none["f1"] - 2 / 3) < 1e-9


def test_select_eval_asks_a_base_model_for_a_completion(tiny_model_dir, base_model_dir):
    """A chat model gets the bare question (its template frames it); a base model (no chat
    template: Gemma 3 270M) "Question: ...\nAnswer:", without which it answers with a newline."""
    from transformers import AutoTokenizer

    sys.path.insert(0, str(BENCH))
    try:
        from select_eval import ask
    finally:
        sys.path.remove(str(BENCH))
    assert ask(AutoTokenizer.from_pretrained(tiny_model_dir), "Who?") == "Who?"
    assert ask(AutoTokenizer.from_pretrained(base_model_dir), "Who?") == "Question: Who?\nAnswer:"


def test_select_eval_can_move_the_answers_passage_first():
    """``--target first``: the fact set's passage holding the answer leads the prompt, the others
    keep their order; a dataset whose answer passage is not known refuses it."""
    from cacheblend.tools.factset import questions

    sys.path.insert(0, str(BENCH))
    try:
        from select_eval import examples
    finally:
        sys.path.remove(str(BENCH))
    plain, first = questions("dev", 12), examples("facts", "dev", 12, None, target="first")
    assert any(q.target != 0 for q in plain)
    for q, f in zip(plain, first):
        assert f.target == 0 and f.passages[0] == q.passages[q.target] and f.question == q.question
        assert f.passages[1:] == [p for i, p in enumerate(q.passages) if i != q.target]
    with pytest.raises(SystemExit, match="needs --dataset facts"):
        examples("pydoc", "dev", 1, None, target="first")


def test_select_eval_asks_splits_the_prompts_by_the_chunk_their_question_names(tiny_model_dir):
    """``--asks``: a question names the chunk holding its rarer tokens, unless that chunk is the
    prompt's first (read alone: ``lexical.named_chunk``); none when no chunk holds them."""
    from types import SimpleNamespace

    from cacheblend import BlendEngine

    sys.path.insert(0, str(BENCH))
    try:
        from select_eval import asks_of
    finally:
        sys.path.remove(str(BENCH))
    engine = BlendEngine.from_pretrained(tiny_model_dir)
    ink, sky, tea = "The ink in the old pen was a deep violet.", "The sky over the harbour was grey.", "Tea was served."
    asked = lambda passages, question: asks_of(engine, SimpleNamespace(passages=passages, question=question))
    assert asked([sky, ink, tea], "What colour was the ink in the old pen?")
    assert not asked([ink, sky, tea], "What colour was the ink in the old pen?")  # the first, read alone
    assert not asked([sky, ink, tea], "Who wrote it?")  # no chunk holds a question token


@quick("neighbour_eval.py")
def test_neighbour_eval_quick(quick_run):
    rows = quick_run.data["rows"]
    assert {(r["blend"], r["warmed_behind"]) for r in rows} == {
        (b, w) for b in ("deviation 15%", "full reuse") for w in ("alone", "similar 1")}


@quick("tune.py")
def test_tune_quick(quick_run):
    data = quick_run.data
    assert data["prompts"] == 1 and len(data["results"]) == 8  # 3 contexts x 2, and 2 sweep settings
    assert all(row["kl"] >= 0 for rows in data["results"].values() for row in rows)


@quick("warm_rate.py")
def test_warm_rate_quick(quick_run):
    rates = quick_run.data["rates"]
    assert len(rates) == 6 and all(r["chunk_tokens_per_s"] > 0 for r in rates.values())


@pytest.mark.skipif(NO_GIT, reason="blend_ab.py compares against a git ref: this checkout has no git history")
@quick("blend_ab.py")
def test_blend_ab_quick(quick_run):
    data = quick_run.data
    assert set(data["median_s"]) == {"new", "old", "full"} and len(data["max_diff"]) == 1


@quick("bench_serve.py", "--out", "{dir}/out")
def test_bench_serve_quick(quick_run):
    data = quick_run.data
    rows = {(r["mode"], r["concurrency"]): r for r in data["rows"]}
    assert set(rows) == {(m, c) for m in ("blend", "full prefill") for c in (1, 2)}
    assert all(rows[("blend", c)]["cached_share"] > 0.5 for c in (1, 2))  # the warmed passages were reused
    assert all(rows[("full prefill", c)]["cached_share"] == 0 for c in (1, 2))
    assert (quick_run.dir / "out" / "bench_serve.png").stat().st_size > 0


@quick("frontier.py", "{dir}/frontier.png", model=False)
def test_frontier_quick(quick_run):
    out, data = quick_run.dir / "frontier.png", quick_run.data
    assert data["inputs"] == [str(ROOT / "docs/runs/select_pydoc_report.json")]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _run_file(path: Path, model: str | None, count: int, methods: dict) -> str:
    path.write_text(json.dumps({"run": {"model": model} if model else {},
                                "meta": {"dataset": "facts", "split": "report", "start": 0, "count": count},
                                "methods": methods}))
    return str(path)


def test_frontier_panel_merges_runs_over_the_same_questions_and_refuses_others(tmp_path):
    """``a.json+b.json`` is one panel: a method both runs hold comes from the first; a run file
    from before run files (no model) counts as the default model's; other questions are refused."""
    sys.path.insert(0, str(BENCH))
    try:
        from frontier import family, panel
    finally:
        sys.path.remove(str(BENCH))
    a = _run_file(tmp_path / "a.json", None, 60, {"full prefill": {"kl": 0.0}, "nb1 deviation": {"kl": 0.1}})
    b = _run_file(tmp_path / "b.json", "smollm2-135m-instruct", 60, {"nb1 deviation": {"kl": 0.2}, "nb1 lexical": {"kl": 0.3}})
    merged = panel(f"{a}+{b}")
    assert merged["methods"] == {"full prefill": {"kl": 0.0}, "nb1 deviation": {"kl": 0.1}, "nb1 lexical": {"kl": 0.3}}
    other = _run_file(tmp_path / "c.json", "qwen2.5-0.5b-instruct", 60, {})
    with pytest.raises(SystemExit, match="must share model"):
        panel(f"{a}+{other}")
    with pytest.raises(SystemExit, match="must share model"):
        panel(f"{a}+{_run_file(tmp_path / 'd.json', None, 50, {})}")
    assert family("nb1 lexical 30%") == ("lexical, default warming", 0.3)
    assert family("lexical") == ("lexical, warmed alone", 0.15)
    assert family("nb1 deviation 5%")[1] == 0.05
    named = family("nb1 lexical named")  # the named chunk's budget and its capped variants: one curve
    assert named[1] == 0.3 and family("nb1 lexical named max15") == (named[0], 0.15)
    default = family("nb1 draft-only 8 last3 gap x")  # SmolLM2's default and its ratios: one curve, not the draft's
    assert default[1] == 0.15 and family("nb1 draft-only 8 last3 gap x 30%") == (default[0], 0.3)
    assert family("nb1 draft-only 8 last3")[0] != default[0]
    assert family("nb1 draft+gap auto 10-30% <0.05")[0] not in (default[0], "nb1 draft+gap auto 10-30% <0.05")
    assert family("nb1 lexical+question 8%")[1] == 0.08


def test_select_eval_merges_runs_of_one_dataset_over_both_splits_and_refuses_another_dataset(tmp_path):
    """``select_eval.py --merge``: the methods every run holds, means weighted by question counts;
    MuSiQue's development and reporting runs merge into one of all 150 (split ``dev+report``); runs
    of another dataset are refused."""
    sys.path.insert(0, str(BENCH))
    try:
        import select_eval
    finally:
        sys.path.remove(str(BENCH))

    def run(name, split, count, methods, dataset="musique_s", questions=None):
        path = tmp_path / name
        path.write_text(json.dumps({"run": {"model": "smollm2-135m-instruct"}, "methods": methods,
                                    "meta": {"dataset": dataset, "split": split, "start": 0, "count": count},
                                    **({"questions": questions} if questions else {})}))
        return str(path)

    def method(f1, kl):
        return {"right": 0.0, "agree": 0.5, "f1": f1, "top1": 0.9, "kl": kl, "share": 0.15, "time": 0.3, "kept": None}

    one = method(1.0, 0.0)
    dev = run("dev.json", "dev", 50, {"full prefill": one, "a": method(0.7, 0.04), "b": one})
    rep = run("rep.json", "report", 100, {"full prefill": one, "a": method(0.85, 0.01)})
    out = tmp_path / "all.json"
    select_eval.main(["--merge", dev, rep, "--run-file", str(out)])
    data = json.loads(out.read_text())
    assert (data["meta"]["split"], data["meta"]["count"], data["meta"]["merged"]) == ("dev+report", 150, [dev, rep])
    assert list(data["methods"]) == ["full prefill", "a"]
    assert data["methods"]["a"]["f1"] == pytest.approx(0.8) and data["methods"]["a"]["kl"] == pytest.approx(0.02)
    assert "questions" not in data  # the runs keep no rows per question: none to merge
    with pytest.raises(SystemExit, match="one dataset"):
        select_eval.main(["--merge", dev, run("facts.json", "report", 60, {"full prefill": one}, "facts")])
    # rows per question in every part: kept, in the parts' order; a measure one part lacks (an older
    # run's) is left out of the means
    rows = lambda f1: {"full prefill": {"f1": [1.0] * 2}, "a": {"f1": f1}}  # noqa: E731
    first = run("first.json", "dev", 2, {"full prefill": one, "a": dict(method(0.5, 0.1), draft_margin=0.3)},
                questions=rows([0.4, 0.6]))
    second = run("second.json", "dev", 2, {"full prefill": one, "a": method(0.7, 0.1)}, questions=rows([0.9, 0.5]))
    select_eval.main(["--merge", first, second, "--run-file", str(out)])
    data = json.loads(out.read_text())
    assert data["questions"]["a"]["f1"] == [0.4, 0.6, 0.9, 0.5] and len(data["questions"]["full prefill"]["f1"]) == 4
    assert "draft_margin" not in data["methods"]["a"] and data["methods"]["a"]["f1"] == pytest.approx(0.6)


def test_chunk_oracle_recomputes_one_passage_and_picks_the_closest():
    """``ChunkWhole(C)`` picks every token of chunk C and nothing else, whatever the budget (none past
    the last chunk); ``best_chunks`` picks per question the chunk method with the highest F1 against
    full prefill's answer, then the lowest KL, then the first chunk, and averages that pick."""
    from cacheblend.blending.selection import Candidates

    co = _bench_module("chunk_oracle")
    n = 300
    zeros = torch.zeros(2, n, 4)
    cand = Candidates(layer=1, fresh_k=zeros, fresh_v=zeros, cached_k=zeros, cached_v=zeros, positions=torch.arange(n),
                      chunk_offsets=torch.arange(n) % 100)
    assert sorted(co.ChunkWhole(1)(cand, 5).tolist()) == list(range(100, 200))
    assert sorted(co.ChunkWhole(2)(cand, 1000).tolist()) == list(range(200, 300))
    assert co.ChunkWhole(3)(cand, 100).numel() == 0

    def row(f1, kl, share, agree):
        return {"f1": f1, "kl": kl, "share": share, "agree": agree}

    run = {"questions": {
        "full prefill": row([1.0, 1.0, 1.0], [0.0] * 3, [1.0] * 3, [True] * 3),
        "nb1 reuse": row([0.5, 0.2, 0.9], [0.3, 0.4, 0.1], [0.01] * 3, [False] * 3),
        "nb1 chunk 2": row([0.5, 0.2, 1.0], [0.1, 0.3, 0.05], [0.2] * 3, [False, False, True]),
        "nb1 chunk 10": row([0.9, 0.2, 1.0], [0.2, 0.3, 0.04], [0.1] * 3, [False, False, True]),
    }}
    best = co.best_chunks(run)
    # question 0: chunk 10's F1; 1: the same F1 and KL, the lower chunk; 2: the same F1, chunk 10's lower KL
    assert best["picks"] == [10, 2, 10] and best["questions"] == 3
    pick = best["methods"]["best single chunk"]
    assert pick["f1"] == pytest.approx((0.9 + 0.2 + 1.0) / 3) and pick["same"] == 1
    assert pick["kl"] == pytest.approx((0.2 + 0.3 + 0.04) / 3) and pick["share"] == pytest.approx((0.1 + 0.2 + 0.1) / 3)
    assert best["methods"]["nb1 reuse"]["f1"] == pytest.approx(1.6 / 3) and "full prefill" not in best["methods"]
    with pytest.raises(SystemExit, match="no 'nb1 chunk C' method"):
        co.best_chunks({"questions": {"nb1 reuse": run["questions"]["nb1 reuse"]}})


@quick("chunk_oracle.py")
def test_chunk_oracle_quick(quick_run):
    """One development fact question: each passage recomputed whole recomputes more than full reuse
    over the same records, and ``--best`` reads the run file back into its table."""
    data = quick_run.data
    methods = data["methods"]
    assert set(methods) == {"full prefill", "nb1 reuse", "nb1 chunk 1", "nb1 chunk 2"}
    assert methods["nb1 chunk 1"]["share"] > methods["nb1 reuse"]["share"] + 0.1
    assert methods["nb1 chunk 2"]["share"] > methods["nb1 reuse"]["share"] + 0.1
    proc = _run([sys.executable, str(BENCH / "chunk_oracle.py"), "--best", str(quick_run.dir / "run.json")])
    assert proc.returncode == 0, proc.stderr
    assert "| best single chunk |" in proc.stdout and "best chunk per question: " in proc.stdout


@quick("draft_score.py")
def test_draft_score_quick(quick_run):
    """One development fact question: the drafted stage 1 (the product's ``selector="draft"``, and
    the same with the question's rows scored) recomputes as much of the prompt as the question
    selector's (the same 15%), both more than full reuse of the same records."""
    methods = quick_run.data["methods"]
    assert set(methods) == {"full prefill", "nb1 reuse", "nb1 question last3", "nb1 draft 4 last3", "nb1 draft-only 4 last3"}
    for name in ("nb1 draft 4 last3", "nb1 draft-only 4 last3"):
        assert methods[name]["share"] == pytest.approx(methods["nb1 question last3"]["share"])
        assert methods[name]["share"] > methods["nb1 reuse"]["share"] + 0.05

# Scripts whose quick run a test above already makes (``test_<name>_quick``) or that another test runs
# (figures.py, gate_eval.py): the catch-all below would only run them a second time.
DEDICATED = {f"{name[5:-6]}.py" for name in list(globals()) if name.startswith("test_") and name.endswith("_quick")}
DEDICATED |= {"figures.py", "gate_eval.py"}


@pytest.mark.parametrize("script", [pytest.param(s, marks=quick(s, model=s not in NO_MODEL))
                                    for s in SCRIPTS if s not in DEDICATED])
def test_quick_of_every_other_script(script, quick_run):
    """A script added later gets at least this: its quick mode runs and writes a run file (checked
    by ``quick_run``)."""
    assert quick_run.data["run"]["command"].startswith(f"python benchmarks/{script} ")


def test_figures_every_marker_names_a_committed_file_and_the_readme_has_no_unmarked_figure():
    listing = _run([sys.executable, str(BENCH / "figures.py")], timeout=60)
    assert listing.returncode == 0, listing.stdout
    assert "README.md:" in listing.stdout and "docs/runs/exact_prompts.json (ok)" in listing.stdout
    strict = _run([sys.executable, str(BENCH / "figures.py"), "--strict", "README.md"], timeout=60)
    assert strict.returncode == 0, strict.stdout


def test_the_readme_benches_ran_each_model_s_current_default():
    """``docs/bench_*.json`` (``cacheblend bench``'s tables in the README) describe the product as it
    ships: each records the config its blended rows ran, which must be its model's default today. A
    default changed without running its benches again fails here (the pydoc table described the
    previous default from stop 57 to stop 63)."""
    from dataclasses import asdict

    from cacheblend.config import BlendConfig

    runs = {p.name: json.loads(p.read_text()) for p in sorted((ROOT / "docs").glob("bench_*.json"))}
    written = {name: run["meta"] for name, run in runs.items() if "meta" in run}
    assert set(written) >= {"bench_pydoc.json", "bench_musique.json", "bench_pydoc_qwen.json", "bench_musique_qwen.json"}
    for name, meta in written.items():
        assert "config" in meta, f"{name}: run before benches recorded their config; run it again"
        default = json.loads(json.dumps(asdict(BlendConfig.for_model(meta["model"]))))
        ran = meta["config"]
        changed = {k: (ran.get(k, "-"), default.get(k, "-")) for k in ran.keys() | default.keys() if ran.get(k) != default.get(k)}
        assert not changed, f"{name} ran {meta['model']} with (ran, default now) {changed}: run it again"


def test_figures_fails_on_a_missing_run_file_and_on_an_unmarked_figure_when_strict(tmp_path):
    doc = tmp_path / "doc.md"
    table = "| a | b |\n|---|---|\n| x | 4.28x |\n"
    doc.write_text(f"# T\n\n<!-- run: docs/runs/exact_prompts.json -->\n{table}\n## U\n\n{table}")
    ok = _run([sys.executable, str(BENCH / "figures.py"), str(doc)], timeout=60)
    assert ok.returncode == 0 and "docs/runs/exact_prompts.json (ok)" in ok.stdout and "NO RUN FILE" in ok.stdout
    assert _run([sys.executable, str(BENCH / "figures.py"), "--strict", str(doc)], timeout=60).returncode == 1
    doc.write_text(f"<!-- run: docs/runs/exact_prompts.json -->\n{table}\nSome prose.\n\n{table}")  # prose ends it
    after_prose = _run([sys.executable, str(BENCH / "figures.py"), str(doc)], timeout=60).stdout
    assert ":2: table '| a | b |' -> docs/runs/exact_prompts.json (ok)" in after_prose
    assert ":8: table '| a | b |' -> NO RUN FILE" in after_prose
    doc.write_text(f"<!-- run: docs/runs/no-such-run.json -->\n{table}")
    missing = _run([sys.executable, str(BENCH / "figures.py"), str(doc)], timeout=60)
    assert missing.returncode == 1 and "no-such-run.json: MISSING" in missing.stdout
    doc.write_text(f"<!-- not measured: defaults -->\n{table}")
    assert _run([sys.executable, str(BENCH / "figures.py"), "--strict", str(doc)], timeout=60).returncode == 0


def test_stale_rows_measures_what_it_says():
    """Constructed chunks with known answers: full prefill's V exactly 0.3 of the way from the lead
    record to the plain one gives alpha 0.3 at every layer and no error left for the best mix; stale
    deviations equal to the recomputed rows' mean are removed whole by the chunk mean (scale 1), and
    a deviation orthogonal to every guess is removed by none."""
    stale_rows = _bench_module("stale_rows")
    torch.manual_seed(0)
    layers, n, dims = 4, 12, 8
    lead, plain = torch.randn(layers, n, dims), torch.randn(layers, n, dims)
    tally = stale_rows.Tally(layers)
    tally.chunk(list(lead + 0.3 * (plain - lead)), plain, lead, torch.arange(n), share=0.25)
    tally.chunk(list(lead + 0.3 * (plain - lead)), plain, lead, torch.arange(n), share=0.25)
    rec = tally.records_summary()
    assert rec["alpha_mean"] == pytest.approx([0.3] * layers, abs=1e-5)
    assert max(rec["best_over_plain"]) < 1e-6 and max(rec["check_alpha_over_plain"]) < 1e-6
    assert min(rec["lead_over_plain"]) == pytest.approx(0.09 / 0.49, rel=1e-4)  # |0.3 d|^2 / |0.7 d|^2
    shift = torch.randn(layers, 1, dims)
    full = plain + shift  # every row deviates by its layer's shift: the recomputed rows' mean is exact
    exact = stale_rows.Tally(layers)
    exact.chunk(list(full), plain, lead, torch.arange(n), share=0.25)
    for band in exact.estimates_summary().values():
        assert band["chunk mean"]["removed"] == pytest.approx(1.0, abs=1e-5)
        assert band["chunk mean"]["scale"] == pytest.approx(1.0, abs=1e-5)
        assert all(0.0 <= v["removed"] <= 1.0 + 1e-6 for v in band.values())
    dev = torch.zeros(layers, n, dims)
    dev[:, :, 0] = torch.tensor([10.0] * 3 + [0.0] * (n - 3))  # only the 3 rows the selector recomputes deviate in dim 0
    dev[:, 3:, 1] = 1.0  # the stale rows deviate in dim 1, which no recomputed row shows
    plain_ortho = torch.zeros(layers, n, dims)
    plain_ortho[:, :, 2] = 1.0  # records alike: cosines all 1
    none = stale_rows.Tally(layers)
    none.chunk(list(plain_ortho + dev), plain_ortho, plain_ortho - 1.0, torch.arange(n), share=0.25)
    for band in none.estimates_summary().values():
        assert all(v["removed"] == pytest.approx(0.0, abs=1e-9) for v in band.values())


@quick("stale_rows.py")
def test_stale_rows_quick(quick_run):
    data = quick_run.data
    assert data["count"] == 1 and data["chunks"] == 5  # the first development question: six passages
    rec = data["records"]
    assert all(b <= c + 1e-6 for b, c in zip(rec["best_over_plain"], rec["check_alpha_over_plain"]))  # the best is best
    for band in data["estimates"].values():
        assert set(band) == set(stale_rows_names()) and all(0.0 <= v["removed"] <= 1.0 + 1e-6 for v in band.values())


def stale_rows_names() -> tuple[str, ...]:
    return _bench_module("stale_rows").ESTIMATES


def test_record_calibration_maps_and_rope():
    """An exact affine relation is learned exactly (ridge near 0) and applied only to the parts and
    layers asked; keys rotated by the model's RoPE come back exactly."""
    rc = _bench_module("record_calibration")
    from cacheblend.blending.rope import apply_rope

    torch.manual_seed(0)
    layers, heads, n, d = 3, 2, 40, 4
    a, b = torch.randn(heads * d, heads * d) * 0.3, torch.randn(heads * d)
    maps = rc.Maps(layers)
    for layer in range(layers):
        for part in (0, 1):
            rec = torch.randn(n, heads * d)
            maps.add(layer, part, rec, rec + rec @ a + b)
    maps.fit(ridge=1e-9)
    kv = torch.randn(layers, 2, heads, n, d)
    out = maps.apply(kv, (1,), first_layer=1)
    assert torch.equal(out[0], kv[0]) and torch.equal(out[:, 0], kv[:, 0])  # layer 0 and K untouched
    rows = rc.flat(kv[2, 1])
    assert torch.allclose(rc.flat(out[2, 1]), rows + rows @ a + b, atol=1e-4)
    stale = rc.stale_mask(rows + torch.arange(n)[:, None].float(), rows, share=0.25)
    assert stale.sum() == n - 10 and not stale[-10:].any()  # the 10 rows deviating most are not stale
    positions = torch.arange(n) * 3.0
    freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    angles = torch.cat([positions[:, None] * freq[None, :]] * 2, -1)
    keys = torch.randn(heads, n, d)
    assert torch.allclose(rc.unrotated(apply_rope(keys, angles.cos(), angles.sin()), angles.cos(), angles.sin()), keys,
                          atol=1e-5)


@quick("record_calibration.py")
def test_record_calibration_quick(quick_run):
    data = quick_run.data
    methods = data["methods"]
    assert data["fit"] == 1 and data["count"] == 1 and len(methods) == 8
    # the maps reach the blend: a mapped method differs from its uncorrected base where it maps a layer
    for name, row in methods.items():
        base = "full reuse" if name.startswith("full reuse") else "deviation 15%"
        maps_a_layer = base == "full reuse" or data["layers"] > 2  # the blend's maps start at layer 2
        assert name == base or (row["kl"] != methods[base]["kl"]) == maps_a_layer, name


def test_named_bridge_recomputes_the_passage_the_named_one_leads_to():
    """Four chunks of 100 tokens. The question (ids 6 and 7) names chunk 1, which alone holds 6; chunk
    2 holds 7 too (a question id: no bridge by it). Chunk 1 also holds 8 and 9, the first hop's
    answer: chunk 3 holds 8, chunk 0 both. So the bridge is chunk 0, or chunk 3 when chunk 0 is read
    alone. "bridge" adds it whole; "bridge 5%" its 20 most deviating tokens (5% of 400); with no
    question id in any chunk, the named config's 5% by deviation."""
    from cacheblend.blending.selection import Candidates

    nb = _bench_module("named_bridge")
    n = 400
    ids = torch.full((n,), 5)
    ids[[150, 160]], ids[[110, 120]], ids[250], ids[[310, 20, 30]] = 6, 8, 7, 8
    ids[130], ids[40] = 9, 9
    fresh = torch.zeros(2, n, 4)
    fresh[:, 300:330, :] = torch.arange(30, 0, -1.0)[None, :, None]  # chunk 3's first 30 deviate, most first
    fresh[:, 210:230, :] = 100.0  # chunk 2's deviate most of all: the control's pick, never the bridge's
    zeros = torch.zeros_like(fresh)
    cand = Candidates(layer=1, fresh_k=zeros, fresh_v=fresh, cached_k=zeros, cached_v=zeros, positions=torch.arange(n),
                      chunk_offsets=torch.arange(n) % 100, ids=ids, question_ids=torch.tensor([6, 7]))
    alone = Candidates(**{**cand.__dict__, "first_alone": True})
    chunk = cand.chunks()
    assert nb.bridge_chunk(ids, chunk, cand.question_ids, 1, False) == 0
    assert nb.bridge_chunk(ids, chunk, cand.question_ids, 1, True) == 3
    assert nb.bridge_chunk(ids, chunk, torch.tensor([6, 8, 9]), 1, True) is None  # the question holds the answer ids
    assert sorted(nb.NamedBridge()(alone, 100).tolist()) == [*range(100, 200), *range(300, 400)]
    assert sorted(nb.NamedBridge()(cand, 100).tolist()) == list(range(200))
    assert sorted(nb.NamedBridge(0.05)(alone, 100).tolist()) == [*range(100, 200), *range(300, 320)]
    none = Candidates(**{**alone.__dict__, "question_ids": torch.tensor([11])})
    assert sorted(nb.NamedBridge(0.05)(none, 20).tolist()) == list(range(210, 230))

