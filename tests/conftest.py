"""Shared test setup: offline, deterministic, one real bundled model per session."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Ray nices its workers (15): beside the real-model lane (below) they starved, and a Ray test of 10 s
# took 3 minutes. The tests' Ray clusters (started here, their workers inheriting this) run at 0.
os.environ.setdefault("RAY_worker_niceness", "0")

import shutil  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

torch.manual_seed(0)

# Two lanes under pytest-xdist (`make test` runs `pytest -n 2`). The real-model quality tests are
# compute bound (fp32 matrix products at the cores' peak); the rest mostly wait on subprocesses,
# servers and sockets (alone, `-m "not real_model"` kept 2 cores 65% busy). So the files of
# REAL_LANE run in one worker, one after another, while the other files are spread over both
# workers: the waits overlap the products instead of adding to them. A file is a unit either way,
# so a module's fixtures are computed once.
#
# Threads: each worker runs on half of torch's threads (its subprocesses too, through
# OMP_NUM_THREADS) while the other is alive, and on all of them once it has finished. An OpenMP team
# of 2 threads on 2 cores beside a busy second process waits at every barrier for whichever thread
# the other process preempted: on all threads beside the other lane, the real-model tests ran 2-3x
# slower than alone (docs/runs/ci_suite.json, stop 58). A fixture keeps the threads its test's setup
# started with. The thread count does not change the results: the models' forwards are bit-identical
# on 1 and 2 threads.
#
# Order: the lane runs its files in REAL_LANE's order, the longest tests first, so that what runs
# when the other worker finishes (and the lane takes every thread) is short tests that start on
# them, not a long one that started on half.
REAL_LANE = (
    "tests/core/test_real_model_qwen.py",
    "tests/core/test_real_model.py",
    "tests/core/test_neighbours.py",
    "tests/core/test_compact_kv.py",
    "tests/core/test_model_catalog.py",
    "tests/core/test_real_families.py",
)
THREADS = torch.get_num_threads()
LANES_KEY = "cacheblend_lanes"  # workerinput: the folder where each worker keeps a file while it runs


def pytest_xdist_make_scheduler(config, log):
    """xdist's file-by-file scheduling, with REAL_LANE's files one unit (the largest, so it starts
    first)."""
    from xdist.scheduler import LoadScopeScheduling

    missing = [p for p in REAL_LANE if not (config.rootpath / p).is_file()]
    if missing:  # a renamed file would drop out of the lane silently
        raise pytest.UsageError(f"tests/conftest.py REAL_LANE names no such file: {missing}")

    class Lanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = _file(nodeid)
            return "real-lane" if path in REAL_LANE else path

    return Lanes(config, log)


def pytest_collection_modifyitems(config, items):
    """Under xdist: REAL_LANE's tests in REAL_LANE's order of files (each file's own order kept),
    in the places the lane's tests held; every other test where it was."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    slots = [i for i, item in enumerate(items) if _file(item.nodeid) in REAL_LANE]
    lane = sorted((items[i] for i in slots), key=lambda item: REAL_LANE.index(_file(item.nodeid)))
    for i, item in zip(slots, lane):
        items[i] = item


def _file(nodeid: str) -> str:
    """The test file of a node id."""
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """Controller: one folder for the run's workers to say they are alive in (``_others_running``)."""
    config = node.config
    if not hasattr(config, "_cacheblend_lanes"):
        config._cacheblend_lanes = tempfile.mkdtemp(prefix="cacheblend-lanes-")
    node.workerinput[LANES_KEY] = config._cacheblend_lanes


def pytest_configure(config):
    """Worker: its file in the lanes folder, holding its pid, while it runs."""
    lanes = getattr(config, "workerinput", {}).get(LANES_KEY)
    if lanes:
        (Path(lanes) / config.workerinput["workerid"]).write_text(str(os.getpid()))


def pytest_unconfigure(config):
    """Worker: its file removed; controller: the folder."""
    if hasattr(config, "workerinput"):
        lanes = config.workerinput.get(LANES_KEY)
        if lanes:
            (Path(lanes) / config.workerinput["workerid"]).unlink(missing_ok=True)
    elif hasattr(config, "_cacheblend_lanes"):
        shutil.rmtree(config._cacheblend_lanes, ignore_errors=True)


def _others_running(config) -> bool:
    """Whether another worker of this run is alive (its file is there and its pid exists)."""
    lanes = getattr(config, "workerinput", {}).get(LANES_KEY)
    if not lanes:
        return False
    for path in Path(lanes).iterdir():
        if path.name == config.workerinput["workerid"]:
            continue
        pid = path.read_text().strip()
        if not pid.isdigit():  # still being written: alive
            return True
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:  # killed before it could remove its file
            continue
        except PermissionError:  # alive, as another user
            pass
        return True
    return False


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures, a module's included, are set up
def pytest_runtest_setup(item):
    """Under xdist: half of torch's threads (subprocesses included) while another worker runs, all
    of them once it has finished; a plain run keeps torch's default."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        threads = max(1, THREADS // 2) if _others_running(item.config) else THREADS
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)


@pytest.fixture(scope="session")
def bundled_dir():
    """The bundled SmolLM2 model as safetensors (converted from GGUF on the first run)."""
    from cacheblend.models import bundled

    return bundled.converted_dir()


@pytest.fixture(scope="session")
def qwen_dir():
    """Qwen2.5-Coder-0.5B-Instruct as safetensors (assembled from six packages and converted on
    the first run: about 30 s on 2 idle cores, docs/runs/convert_models.json)."""
    from cacheblend.models import bundled

    return bundled.converted_dir("qwen2.5-0.5b-instruct")


@pytest.fixture(scope="session")
def gemma_dir():
    """Gemma 3 270M (base) as safetensors: the one place tests convert it (on the first run, about
    30 s on 2 idle cores, docs/runs/convert_models.json; then cached)."""
    from cacheblend.models import bundled

    return bundled.converted_dir("gemma3-270m")


@pytest.fixture(scope="session")
def real_engine():
    """The real bundled model, shared by every real-model test (fp32 KV for exactness)."""
    from cacheblend import shared_engine

    return shared_engine()


@pytest.fixture(scope="session")
def fresh_real_engine(real_engine):
    """Builds a new engine over the bundled model's loaded weights (shared, not copied) with its own
    empty KV store and neighbour pool: ``fresh_real_engine(**BlendConfig fields)``.

    The shared engine picks each chunk's neighbours among every chunk any earlier test warmed, and
    keeps the first KV it computed for a text, so a quality test reading it would see other KV
    when run alone (``-k``) than in the suite. A test that warms its whole pool on a fresh engine
    (one ``warm`` call, or explicit ``neighbours=``) reads the same KV however it is run.
    """
    from cacheblend import BlendConfig, BlendEngine

    def make(**config) -> BlendEngine:
        model, tokenizer = real_engine.adapter.model, real_engine.tokenizer
        return BlendEngine(model, tokenizer, config=BlendConfig(**config), name=real_engine.name)

    return make


def _save_tiny_llama(path, tokenizer_dir, chat_template: bool) -> str:
    """A tiny random Llama with the bundled tokenizer, saved as a HF folder: "another model"."""
    from tiny_models import COMMON
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    if not chat_template:
        tokenizer.chat_template = None
    torch.manual_seed(0)
    config = LlamaConfig(
        **dict(COMMON, vocab_size=len(tokenizer), num_hidden_layers=2, max_position_embeddings=8192),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return str(path)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, bundled_dir):
    """Another real model (a tiny random Llama with the bundled tokenizer and chat template), saved
    as a folder: its KV must never be confused with the bundled model's."""
    return _save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), bundled_dir, chat_template=True)


@pytest.fixture(scope="session")
def base_model_dir(tmp_path_factory, bundled_dir):
    """A tiny random Llama whose tokenizer has no chat template (a base model)."""
    return _save_tiny_llama(tmp_path_factory.mktemp("tiny-base"), bundled_dir, chat_template=False)
