"""One shared engine per model, whatever the spelling of model, device and dtype (issue 9)."""

import pytest

from cacheblend import shared_engine
from cacheblend.models import bundled
from cacheblend.registry import engine_key


def test_spellings_of_the_bundled_model_share_one_key(bundled_dir):
    key = engine_key(bundled.ALIAS)
    assert key == (bundled.ALIAS, "cpu", "float32")
    assert engine_key(str(bundled_dir), device="cpu", dtype="float32") == key
    assert engine_key(str(bundled_dir) + "/", device="auto", dtype=None) == key
    assert engine_key(str(bundled.gguf_path())) == key
    assert engine_key(bundled.ALIAS, dtype="bfloat16") != key
    assert engine_key("some-org/some-model") == ("some-org/some-model", "cpu", "float32")


@pytest.mark.real_model
def test_a_warmer_and_an_llm_spelled_differently_meet_in_one_engine(bundled_dir):
    assert shared_engine() is shared_engine(str(bundled_dir), device="cpu", dtype="float32")


def test_bad_spellings_are_value_errors():
    with pytest.raises(ValueError, match="device"):
        engine_key(bundled.ALIAS, device="gpu")
    with pytest.raises(ValueError, match="dtype"):
        engine_key(bundled.ALIAS, dtype="float8")
