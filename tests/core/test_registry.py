"""One shared engine per model, whatever the spelling of model, device and dtype (issue 9)."""

import pytest
import torch

from cacheblend import shared_engine
from cacheblend.models import bundled
from cacheblend.models.loading import resolve_device
from cacheblend.registry import engine_key


def test_spellings_of_the_bundled_model_share_one_key(bundled_dir):
    cpu = engine_key(bundled.ALIAS, device="cpu")
    assert cpu == (bundled.ALIAS, "cpu", "float32")
    assert engine_key(str(bundled_dir), device="cpu", dtype="float32") == cpu
    assert engine_key(str(bundled.gguf_path()), device="cpu") == cpu
    assert engine_key(bundled.ALIAS, device="cpu", dtype="bfloat16") != cpu
    assert engine_key("some-org/some-model", device="cpu") == ("some-org/some-model", "cpu", "float32")
    # "auto" is whatever this machine resolves it to (cuda:N on a CUDA machine), in one spelling
    key = engine_key(bundled.ALIAS)
    assert key[0] == bundled.ALIAS and key[1].split(":")[0] == resolve_device("auto")
    assert engine_key(str(bundled_dir) + "/", device="auto", dtype=None) == key
    assert engine_key(str(bundled_dir), device=resolve_device("auto"), dtype=key[2]) == key
    assert engine_key(str(bundled.gguf_path())) == key
    assert engine_key("some-org/some-model") == ("some-org/some-model", *key[1:])
    if torch.cuda.is_available():
        here = f"cuda:{torch.cuda.current_device()}"
        assert engine_key(bundled.ALIAS, device="cuda") == engine_key(bundled.ALIAS, device=here)


@pytest.mark.real_model
def test_a_warmer_and_an_llm_spelled_differently_meet_in_one_engine(bundled_dir):
    dtype = engine_key(bundled.ALIAS)[2]
    assert shared_engine() is shared_engine(str(bundled_dir), device=resolve_device("auto"), dtype=dtype)


def test_bad_spellings_are_value_errors():
    with pytest.raises(ValueError, match="device"):
        engine_key(bundled.ALIAS, device="gpu")
    with pytest.raises(ValueError, match="dtype"):
        engine_key(bundled.ALIAS, dtype="float8")
