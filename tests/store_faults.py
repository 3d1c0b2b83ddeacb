"""Damage done to stored record bytes, as bit rot, a cut copy or another model's store leave it."""

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
