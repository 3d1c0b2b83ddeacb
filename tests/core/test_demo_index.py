"""PassageIndex.save is one atomic step: a save killed with SIGKILL at any point of it leaves the
old index or the new one, whole (real FAISS, real MiniLM embeddings, a real killed process)."""

import json
import os
import signal
import subprocess
import sys

import faiss
import numpy as np
import pytest

from cacheblend.tools.demo_index import PassageIndex, default_embedder

# Loads the index at argv[2] and saves it over argv[3], stopping at kill point argv[1] (it prints
# "paused" there and sleeps until killed). The embedder is not needed to save.
_SAVER = """
import os, sys, time
from pathlib import Path
import faiss
from cacheblend.tools.demo_index import PassageIndex

point, src, dst = sys.argv[1:4]
index = PassageIndex.load(src, embedder=None)


def pause(*_):
    print("paused", flush=True)
    time.sleep(3600)


replaces, real_replace, real_write_index, real_write_text = [0], os.replace, faiss.write_index, Path.write_text


def replace(a, b):
    replaces[0] += 1
    if point == "before publish" and replaces[0] == 1:
        pause()
    real_replace(a, b)
    if (point == "published" and replaces[0] == 1) or (point == "first link" and replaces[0] == 2):
        pause()


def write_text(path, text, **kw):  # half the passages written
    real_write_text(path, text[: len(text) // 2], **kw)
    pause()


os.replace = replace
if point == "index written":
    faiss.write_index = lambda *a: (real_write_index(*a), pause())
if point == "passages half":
    Path.write_text = write_text
index.save(dst)
"""
BEFORE = ["index written", "passages half", "before publish"]  # the old index must load
AFTER = ["published", "first link"]  # the new one must


@pytest.fixture(scope="module")
def embedder():
    return default_embedder()


def _index(embedder, texts):
    index = PassageIndex(embedder)
    index.add(texts)
    return index


def _same(a: PassageIndex, b: PassageIndex) -> bool:
    return a.texts == b.texts and np.array_equal(a.index.reconstruct_n(0, a.index.ntotal),
                                                 b.index.reconstruct_n(0, b.index.ntotal))


def _old_layout(index: PassageIndex, d) -> None:
    """index.faiss and passages.jsonl as plain files, as saves before the generation folders wrote."""
    d.mkdir()
    faiss.write_index(index.index, str(d / "index.faiss"))
    (d / "passages.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in index.texts))


@pytest.mark.parametrize("layout", ["generations", "old"])
def test_save_killed_at_each_step_leaves_the_old_or_the_new_index(embedder, tmp_path, layout):
    old = _index(embedder, [f"The old passage {i} is about rivers." for i in range(5)])
    new = _index(embedder, [f"The new passage {i} is about mountains and rivers." for i in range(9)])
    new.save(tmp_path / "new")
    points = BEFORE + AFTER if layout == "old" else BEFORE + ["published"]  # links exist already
    for point in points:
        dst = tmp_path / point.replace(" ", "-")
        _old_layout(old, dst) if layout == "old" else old.save(dst)
        assert _same(PassageIndex.load(dst, embedder), old)
        child = subprocess.Popen([sys.executable, "-c", _SAVER, point, str(tmp_path / "new"), str(dst)],
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline() == "paused\n", f"the save never reached {point!r}"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
        loaded = PassageIndex.load(dst, embedder)
        assert _same(loaded, old if point in BEFORE else new), point
        assert PassageIndex.exists(dst) and loaded.search("mountains", 1)[0] in loaded.texts
        new.save(dst)  # the next save completes, and removes the killed save's folder
        assert _same(PassageIndex.load(dst, embedder), new)
        assert len(list(dst.glob(".gen-*"))) <= 2
        assert json.loads((dst / "passages.jsonl").read_text().splitlines()[0]) == {"text": new.texts[0]}


def test_a_missing_index_is_a_clear_error(embedder, tmp_path):
    assert not PassageIndex.exists(tmp_path)
    with pytest.raises(FileNotFoundError, match="holds no index"):
        PassageIndex.load(tmp_path, embedder)
