"""Finding warmed chunk texts inside arbitrary prompts."""

from cacheblend import ChunkFinder
from cacheblend.prompts.request import prompt_from_text

A = "Alpha passage: the river Ost freezes in March, and the ferries stop for nine days."
B = "Beta passage: café owners in Lünen serve ✓ spiced tea — always with two biscuits."
C = "Gamma"  # shorter than the anchor


def test_finds_chunks_in_any_order_template_and_separators():
    finder = ChunkFinder([A, B, C], min_chars=1)
    for sep in ["\n\n", "\n---\n", " | ", "\n", "<doc>"]:
        prompt = f"<|sys|>Context:{sep}{B}{sep}{A}{sep}{C}{sep}Question: why?"
        spans = finder.find(prompt)
        assert [s.text for s in spans] == [B, A, C]
        assert all(prompt[s.start : s.end] == s.text for s in spans)


def test_same_chunk_twice_and_unicode():
    finder = ChunkFinder([B])
    prompt = f"{B}\n\n{B}"
    assert [s.text for s in finder.find(prompt)] == [B, B]


def test_prompt_text_keeps_the_prompt_and_locates_its_chunks():
    finder = ChunkFinder([A, B])
    prompt = f"pre {A} mid {B} post"
    found = prompt_from_text(prompt, finder)
    assert found.text == prompt
    assert [(s.start, s.end, s.text) for s in found.chunks] == [(4, 4 + len(A), A), (9 + len(A), 9 + len(A) + len(B), B)]


def test_altered_chunk_is_not_found():
    finder = ChunkFinder([A])
    assert finder.find(A[:-1] + "!") == [] and finder.find(A.upper()) == []
    assert finder.find(A[: len(A) // 2]) == []  # truncated by a framework


def test_longest_match_wins_when_chunks_share_a_start():
    long = A + " And more text follows here."
    finder = ChunkFinder([A, long])
    assert [s.text for s in finder.find(f"x {long} y")] == [long]
    assert [s.text for s in finder.find(f"x {A} y")] == [A]


def test_empty_finder_and_prompt():
    assert ChunkFinder().find("anything") == [] and ChunkFinder([A]).find("") == []


def test_short_chunk_is_not_found_inside_a_word():
    finder = ChunkFinder(["cat", "42"], min_chars=1)
    assert finder.find("concatenate 1420") == []
    assert [s.text for s in finder.find("a cat, 42.")] == ["cat", "42"]
    assert [s.text for s in finder.find("cat")] == ["cat"]


def test_short_texts_are_not_searched_for_by_default():
    finder = ChunkFinder([A, C])
    assert len(finder) == 1 and [s.text for s in finder.find(f"{C} {A}")] == [A]
