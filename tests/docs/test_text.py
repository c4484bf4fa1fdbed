"""Decoding, normalising and paginating plain text."""

import random

import pytest

from app.docs import PAGE_CHARS, decode_text
from app.docs.text import (
    clean_title,
    cut_at_whitespace,
    first_line,
    looks_binary,
    normalise,
    paginate,
    split_at_paragraphs,
)

SAMPLE = "café “quoted” – naïve 漢字 😀"

# ---- decode_text


@pytest.mark.parametrize(
    "data",
    [
        SAMPLE.encode("utf-8"),
        b"\xef\xbb\xbf" + SAMPLE.encode("utf-8"),
        b"\xff\xfe" + SAMPLE.encode("utf-16-le"),
        b"\xfe\xff" + SAMPLE.encode("utf-16-be"),
        b"\xff\xfe\x00\x00" + SAMPLE.encode("utf-32-le"),
        b"\x00\x00\xfe\xff" + SAMPLE.encode("utf-32-be"),
    ],
    ids=["utf-8", "utf-8-bom", "utf-16-le-bom", "utf-16-be-bom", "utf-32-le-bom", "utf-32-be-bom"],
)
def test_decode_text_unicode_encodings(data):
    assert decode_text(data) == SAMPLE


def test_decode_text_cp1252_fallback():
    assert decode_text(b"caf\xe9 \x93quoted\x94 \x80 \x85") == "café “quoted” € …"


def test_decode_text_bytes_cp1252_leaves_undefined_are_latin1():
    # 0x81, 0x8d, 0x8f, 0x90, 0x9d have no cp1252 character.
    assert decode_text(b"\xe9\x81\x8d\x8f\x90\x9d") == "é\x81\x8d\x8f\x90\x9d"


def test_decode_text_utf8_cut_mid_character_stays_utf8():
    data = "naïve café".encode()[:-1]  # last byte of "é" lost
    assert decode_text(data) == "naïve caf\ufffd"


def test_decode_text_invalid_utf8_inside_falls_back_to_cp1252():
    assert decode_text(b"ok \xff then \xc3\xa9") == "ok ÿ then Ã©"


def test_decode_text_odd_length_utf16_does_not_raise():
    assert decode_text(b"\xff\xfea\x00b") == "a\ufffd"


def test_decode_text_never_raises_on_random_bytes():
    rng = random.Random(1234)
    for _ in range(200):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
        assert isinstance(decode_text(data), str)


def test_decode_text_empty():
    assert decode_text(b"") == ""


# ---- looks_binary / normalise


def test_looks_binary():
    rng = random.Random(7)
    noise = decode_text(bytes(rng.randrange(256) for _ in range(4000)))
    assert looks_binary(noise)
    assert not looks_binary("plain text\twith tabs\r\nand a form feed\f" * 50)
    assert not looks_binary("long text with one stray NUL \x00 " + "words " * 100)
    assert not looks_binary("")


def test_normalise():
    raw = "a  \r\nb\t\r\r\r\rc\x00d\x1b\ufeff \n \n \n\ne\x0bf\fg  \fh\u2028i"
    assert normalise(raw) == "a\nb\n\ncd\n\ne\nf\fg\fh\ni"


def test_normalise_removes_lone_surrogates():
    assert normalise("a\ud800b") == "ab"


# ---- paginate


def _paragraphs(*sizes: int) -> list[str]:
    """Paragraphs of `size - 1` chars in distinct 9-char words, so a test can see exactly
    where pages were cut."""
    return [" ".join(f"p{n}w{i:06d}" for i in range(size // 10)) for n, size in enumerate(sizes)]


def test_paginate_fills_pages_with_whole_paragraphs():
    p = _paragraphs(1000, 1000, 1000, 1000, 1000)
    assert [len(text) for text in p] == [999] * 5
    # 999 + 2 + 999 + 2 + 999 = 3001 does not fit in 3000.
    assert paginate("\n\n".join(p)) == [
        f"{p[0]}\n\n{p[1]}",
        f"{p[2]}\n\n{p[3]}",
        p[4],
    ]


def test_paginate_exactly_full_page():
    p = ["a" * 1499, "b" * 1499]  # 1499 + 2 + 1499 == 3000
    assert paginate("\n\n".join(p)) == ["\n\n".join(p)]
    assert paginate("\n\n".join(["a" * 1499, "b" * 1500])) == ["a" * 1499, "b" * 1500]


def test_paginate_keeps_a_short_text_whole():
    assert paginate("Title\n\nOne paragraph.\nSecond line.") == [
        "Title\n\nOne paragraph.\nSecond line."
    ]


def test_paginate_empty_text():
    assert paginate("") == []
    assert paginate("\n\n\n") == []


def test_paginate_form_feeds_are_page_breaks():
    text = normalise("page one\n\fpage two\n\n\n\f\fpage four\f\n")
    assert paginate(text) == ["page one", "page two", "", "page four"]


def test_paginate_splits_an_oversized_explicit_page():
    long_page = "\n\n".join(["x" * 2000] * 7)  # 14012 chars > 4 x PAGE_CHARS
    assert paginate(f"short\f{long_page}") == ["short"] + ["x" * 2000] * 7


def test_huge_paragraph_is_cut_at_whitespace_never_inside_a_word():
    (paragraph,) = _paragraphs(10_000)
    pages = split_at_paragraphs(paragraph)
    assert len(pages) == 4
    assert all(len(page) <= PAGE_CHARS for page in pages)
    assert " ".join(pages).split() == paragraph.split()  # every word whole, in order


def test_cut_prefers_a_line_break_in_the_second_half():
    text = "a" * 70 + "\n" + "b b b b b b b b b b"
    assert cut_at_whitespace(text, 80) == ["a" * 70, "b b b b b b b b b b"]


def test_cut_a_word_longer_than_a_page():
    assert cut_at_whitespace("x" * 25 + " tail", 10) == ["x" * 10, "x" * 10, "x" * 5 + " tail"]


def test_cut_is_linear_on_a_huge_paragraph():
    text = ("word " * 2_000_000).strip()  # 10 MB, one paragraph
    pages = cut_at_whitespace(text, PAGE_CHARS)
    assert sum(len(page.split()) for page in pages) == 2_000_000


# ---- titles


def test_clean_title():
    assert clean_title("  A\n  multi-line\ttitle\x00 ") == "A multi-line title"
    assert clean_title(None) == ""


def test_first_line_is_a_title_only_when_short():
    assert first_line(["", "  First line  \nsecond"]) == "First line"
    assert first_line(["x" * 121 + "\nshort"]) == ""
    assert first_line(["x" * 120]) == "x" * 120
