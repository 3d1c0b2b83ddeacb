"""Damage done to stored record bytes, as bit rot, a cut copy or another model's store leave it;
and writers killed at chosen points of a record write."""

import torch

from cacheblend.stores import integrity

DAMAGES = ["inf", "truncated", "foreign"]


def damage(data: bytes, how: str, fingerprint: str, key: str) -> bytes:
    if how == "inf":  # 2 KiB of the tensor data overwritten with fp16 inf
        start = len(data) - 4096
        return data[:start] + torch.full((1024,), float("inf")).half().numpy().tobytes() + data[start + 2048 :]
    if how == "truncated":
        return data[: len(data) - 100]
    if how == "foreign":  # a whole, valid record of another model
        return integrity.encode(integrity.decode(data, fingerprint, key), "0" * 64)
    raise ValueError(how)


# Kill points inside a disk record write, for the kill -9 test (KILL_POINTS[i] in FORKING_WARMER).
KILL_POINTS = ["anywhere", "write", "rename", "catalogue"]

# A process that loads a tiny engine once, then per stdin line {"texts", "point", "after"} forks a
# child that warms the texts into {store}; it prints the child's pid, then its wait status. With a
# point other than "anywhere", the child stops there at its (after + 1)-th record, prints
# "paused <point>" and sleeps until killed: "write" with half the record's bytes in its temp file,
# "rename" with the whole temp file fsynced but not renamed, "catalogue" with the record in place
# and half its catalogue line written.
FORKING_WARMER = """
import json, os, sys, time, torch
torch.set_num_threads(1)  # no intra-op thread pool in a process that forks
sys.path.insert(0, {tests!r})
from tiny_models import tiny_model
from transformers import AutoTokenizer
from cacheblend import BlendConfig, BlendEngine

config = BlendConfig(kv_dtype="float32", neighbours=0)
engine = BlendEngine(tiny_model("llama"), AutoTokenizer.from_pretrained({tok!r}), config=config)


def pause(point):
    print("paused " + point, flush=True)
    time.sleep(3600)


class HalfFile:
    def __init__(self, f):
        self.f = f
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.f.close()
    def write(self, data):
        self.f.write(data[: len(data) // 2])
        self.f.flush()
        pause("write")


def stop_at(point, after):
    seen = [0]
    def due():
        seen[0] += 1
        return seen[0] == after + 1
    real = {{"write": os.fdopen, "rename": os.replace, "catalogue": os.write}}[point]
    if point == "write":
        os.fdopen = lambda fd, *a, **k: HalfFile(real(fd, *a, **k)) if due() else real(fd, *a, **k)
    elif point == "rename":
        os.replace = lambda src, dst: pause(point) if due() else real(src, dst)
    else:
        os.write = lambda fd, data: (real(fd, data[: len(data) // 2]), pause(point)) if due() else real(fd, data)


print("ready", flush=True)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        if job["point"] != "anywhere":
            stop_at(job["point"], job["after"])
        engine.warm(job["texts"], store_dir={store!r}, batch_size=1, progress=False)
        os._exit(0)
    print(pid, flush=True)
    print(os.waitpid(pid, 0)[1], flush=True)
"""
