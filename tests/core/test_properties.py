"""Property tests (hypothesis): the chunk finder on arbitrary text, the record decoder on arbitrary
and on damaged bytes.

The finder runs on every prompt a client sends, the decoder on every byte a disk or a Redis server
hands back; neither may crash, and neither may ever hand a wrong chunk to blending. Examples are
bounded (``max_examples``) and ``deadline=None`` (a shared 2-core machine has no stable timing).
"""

import json
import os
import tempfile

import pytest
import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from cacheblend.prompts.finder import MIN_CHARS, ChunkFinder
from cacheblend.stores import compact, integrity
from cacheblend.stores.record import ChunkRecord

BOUNDED = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- the chunk finder ------------------------------------------------------------------------------
# Texts from a small alphabet collide, repeat and overlap far more often than arbitrary unicode,
# which is where a scanner goes wrong; arbitrary unicode is drawn too (case, digits, marks, CJK).
_small = st.text(alphabet="ab \n.-1é", max_size=120)
_any = st.text(max_size=120)
texts = st.one_of(_small, _any)
chunks = st.one_of(
    st.text(alphabet="ab \n.1é", min_size=MIN_CHARS, max_size=80),
    st.text(min_size=MIN_CHARS, max_size=80),
).map(str.strip).filter(lambda t: len(t) >= MIN_CHARS)
SEPARATORS = st.sampled_from(["\n\n", " ", "\n", ". ", " | ", "\t"])


def _check_spans(finder: ChunkFinder, prompt: str, known: set[str]):
    spans = finder.find(prompt)
    end = 0
    for span in spans:
        assert span.text in known, "a span for a text never added"
        assert prompt[span.start : span.end] == span.text, "a span that is not the chunk's text at that offset"
        assert span.start >= end, "spans overlap or are out of order"
        end = span.end
    return spans


@BOUNDED
@given(known=st.lists(chunks, max_size=6), prompt=texts)
def test_finder_spans_are_exact_ordered_and_disjoint_on_any_prompt(known, prompt):
    finder = ChunkFinder(known)
    _check_spans(finder, prompt, set(known))


@BOUNDED
@given(known=st.lists(chunks, max_size=6), pieces=st.lists(st.one_of(texts, st.integers(0, 5)), max_size=8),
       sep=SEPARATORS)
def test_finder_on_prompts_made_of_chunks_and_noise(known, pieces, sep):
    """Prompts that hold known chunks (whole, cut, or glued to noise) next to arbitrary text."""
    assume(known)
    parts = [known[p % len(known)] if isinstance(p, int) else p for p in pieces]
    prompt = sep.join(parts)
    _check_spans(ChunkFinder(known), prompt, set(known))


@BOUNDED
@given(chunk=chunks, before=texts, after=texts, left=SEPARATORS, right=SEPARATORS)
@example(chunk="a" * MIN_CHARS, before="a", after="a", left=" ", right=" ")
def test_finder_finds_a_chunk_inserted_between_separators(chunk, before, after, left, right):
    """The only known chunk, placed in arbitrary text between separators, is found where it is put
    (or, when the text around it repeats it, at an earlier copy that covers that place)."""
    prompt = before + left + chunk + right + after
    at = len(before) + len(left)
    spans = _check_spans(ChunkFinder([chunk]), prompt, {chunk})
    assert any(s.start <= at < s.end for s in spans), f"the chunk inserted at {at} was not found"


@BOUNDED
@given(known=st.lists(chunks, min_size=1, max_size=5), pick=st.integers(0, 4), before=texts, after=texts,
       sep=SEPARATORS)
def test_finder_inserted_chunk_is_found_unless_another_known_chunk_covers_it(known, pick, before, after, sep):
    chunk = known[pick % len(known)]
    prompt = before + sep + chunk + sep + after
    at = len(before) + len(sep)
    spans = _check_spans(ChunkFinder(known), prompt, set(known))
    covering = [s for s in spans if s.start <= at < s.end or at <= s.start < at + len(chunk)]
    assert covering, "neither the inserted chunk nor a chunk overlapping it was found"


@BOUNDED
@given(text=texts)
def test_finder_never_searches_for_short_texts(text):
    finder = ChunkFinder([text.strip()])
    spans = finder.find(text * 2)
    assert all(len(s.text) >= MIN_CHARS for s in spans)
    assert (len(finder) == 1) is (len(text.strip()) >= MIN_CHARS)


# -- the record decoder ---------------------------------------------------------------------------
FP, KEY = "f" * 64, "ab" * 32


def _record(codec: str, dtype: torch.dtype, tokens: int, seed: int) -> tuple[bytes, ChunkRecord]:
    """A valid record's bytes and the record a reader of those bytes must get back."""
    torch.manual_seed(seed)
    kv = torch.randn(2, 2, 2, tokens, 8).to(dtype)  # [layers, 2, kv_heads, tokens, head_dim]
    blob = integrity.encode(ChunkRecord(KEY, kv, f"chunk text {seed}"), FP, codec)
    return blob, integrity.decode(blob, FP, KEY)


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _decodes_to_nothing_or(data: bytes, stored: ChunkRecord | None):
    """decode(data) raises RecordError or returns exactly ``stored`` (None: it must raise)."""
    try:
        got = integrity.decode(data, FP, KEY)
    except integrity.RecordError:
        return
    assert stored is not None, "arbitrary bytes decoded to a record"
    assert (got.key, got.text) == (stored.key, stored.text)
    assert (got.kv.dtype, got.kv.shape) == (stored.kv.dtype, stored.kv.shape)
    assert _bits(got.kv) == _bits(stored.kv), "a record whose tensor bytes differ from what was stored"


def _header_of(fields: dict) -> bytes:
    raw = json.dumps(fields).encode()
    return len(raw).to_bytes(8, "little") + raw


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@BOUNDED
@given(data=st.binary(max_size=600))
def test_decoder_on_arbitrary_bytes_raises_only_record_error(data):
    _decodes_to_nothing_or(data, None)


@BOUNDED
@given(header=st.dictionaries(st.sampled_from(["__metadata__", "kv", "k_scale", "x"]), json_values, max_size=3),
       meta=st.none() | st.dictionaries(st.sampled_from(["fingerprint", "layout", "key", "checksum", "text", "codec",
                                                         "dtype"]), json_values, max_size=7),
       tail=st.binary(max_size=200))
def test_decoder_on_arbitrary_headers_raises_only_record_error(header, meta, tail):
    """Headers that parse as JSON, with every field of ours present or not, of any JSON type."""
    if meta is not None:
        header["__metadata__"] = dict(meta, fingerprint=FP, layout="1", key=KEY) if len(meta) % 2 else meta
    _decodes_to_nothing_or(_header_of(header) + tail, None)


CODECS = st.sampled_from([("plain", torch.float16), ("plain", torch.float32), ("plain", torch.bfloat16),
                          ("int8", torch.float16), ("int4", torch.float16), ("int8", torch.float32)])


@st.composite
def damaged(draw):
    """(damaged bytes, the record the undamaged bytes decode to)."""
    codec, dtype = draw(CODECS)
    blob, stored = _record(codec, dtype, draw(st.integers(1, 40)), draw(st.integers(0, 3)))
    how = draw(st.sampled_from(["flip", "cut", "extend", "splice", "field"]))
    if how == "flip":  # bit rot anywhere: header or tensor bytes
        i, bit = draw(st.integers(0, len(blob) - 1)), draw(st.integers(0, 7))
        data = bytearray(blob)
        data[i] ^= 1 << bit
        return bytes(data), stored
    if how == "cut":
        return blob[: draw(st.integers(0, len(blob) - 1))], stored
    if how == "extend":
        return blob + draw(st.binary(min_size=1, max_size=64)), stored
    if how == "splice":  # a run of bytes overwritten
        i = draw(st.integers(0, len(blob) - 1))
        junk = draw(st.binary(min_size=1, max_size=32))
        return blob[:i] + junk + blob[i + len(junk) :], stored
    # a header field rewritten with the header still well-formed: what a bad merge, a hand edit or
    # another writer's bug leave; the tensor bytes and the recorded checksum are untouched
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n])
    names = sorted(header)
    name = draw(st.sampled_from(names))
    entry = header[name]
    field = draw(st.sampled_from(sorted(entry)))
    if name != "__metadata__" and field == "dtype":
        entry[field] = draw(st.sampled_from(["F16", "BF16", "I16", "U16", "F32", "I32", "U8", "I8", "F64"]))
    elif name != "__metadata__" and field == "shape":
        entry[field] = draw(st.permutations(entry[field])) if draw(st.booleans()) else \
            draw(st.lists(st.integers(0, 64), max_size=6))
    elif name == "__metadata__" and field == "checksum":
        entry[field] = draw(st.sampled_from([entry[field].upper(), entry[field][:-1] + "0", "xxh3_128:"]))
    else:
        entry[field] = draw(json_values | st.text(max_size=20))
    assume(header != json.loads(blob[8 : 8 + n]))
    return _header_of(header) + blob[8 + n :], stored


@BOUNDED
@given(case=damaged())
def test_decoder_on_damaged_records_never_returns_other_bytes(case):
    data, stored = case
    _decodes_to_nothing_or(data, stored)


@pytest.mark.parametrize("field,value", [
    (("kv", "dtype"), "I16"),            # same width: every byte reinterpreted
    (("kv", "shape"), [2, 2, 2, 8, 5]),  # tokens and head_dim swapped: same byte count
    (("__metadata__", "text"), "another chunk's text"),
    (("__metadata__", "codec"), "int8"),
])
def test_header_tampering_examples(field, value):
    """The header rewrites that a checksum of the tensor bytes alone cannot see."""
    blob, stored = _record("plain", torch.float16, 5, 0)
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n])
    header[field[0]][field[1]] = value
    with pytest.raises(integrity.RecordError):
        integrity.decode(_header_of(header) + blob[8 + n :], FP, KEY)


@BOUNDED
@given(case=damaged())
def test_probe_on_damaged_files_raises_only_record_or_os_error(case):
    """``probe`` (the header-only check ``warm`` and ``in`` use) on the same damage."""
    data, _ = case
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(data)
    try:
        integrity.probe(f.name, FP, KEY)
    except (integrity.RecordError, OSError):
        pass
    finally:
        os.unlink(f.name)


@settings(max_examples=60, deadline=None)
@given(codec=CODECS, tokens=st.integers(1, 70), seed=st.integers(0, 10**6))
@example(codec=("int4", torch.float16), tokens=62, seed=61)  # one int4 pass moves a scale by an ulp
def test_valid_records_read_back_exactly_and_stay_stable(codec, tokens, seed):
    """The positive half: undamaged bytes read back as stored (plain: the very tensor written), and
    what every tier holds (``compact.roundtrip``) written again reads back bitwise the same, so a
    record copied from one tier into another is the same KV."""
    codec, dtype = codec
    torch.manual_seed(seed)
    kv = torch.randn(2, 2, 2, tokens, 8).to(dtype)  # [layers, 2, kv_heads, tokens, head_dim]
    got = integrity.decode(integrity.encode(ChunkRecord(KEY, kv, "t" * tokens), FP, codec), FP, KEY)
    assert got.text == "t" * tokens and got.kv.shape == kv.shape
    if codec == "plain":
        assert _bits(got.kv) == _bits(kv)
    held = compact.roundtrip(kv, codec)
    again = integrity.decode(integrity.encode(ChunkRecord(KEY, held, "t"), FP, codec), FP, KEY)
    assert _bits(again.kv) == _bits(held)
