"""Finding a cited passage again on its page, and the structure of a text page.

A citation carries a passage whose whitespace was collapsed and which may be cut
short with "…" (app.qa.citations.passage). To highlight it, the viewer has to find it
again in the page's original text (text documents) or among the words pymupdf
extracts from the page (PDF). Both are done by comparing normalised words, not
characters, so line breaks, hyphen-free wrapping and ligatures do not matter.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from difflib import SequenceMatcher

_WORD = re.compile(r"\w+")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n\s*")
_MARKDOWN_HEADING = re.compile(r"#{1,6}\s+")
HEADING_MAX_CHARS = 90
HEADING_MAX_WORDS = 12
MIN_ANCHOR_WORDS = 3  # a shorter common run is too likely to be a coincidence


# ---- Words -----------------------------------------------------------------


def norm(word: str) -> str:
    """Case- and compatibility-folded (the PDF ligature 'ﬁ' equals 'fi')."""
    return unicodedata.normalize("NFKC", word).casefold()


def words_with_spans(text: str) -> list[tuple[str, int, int]]:
    """(normalised word, start, end) for every word of ``text``."""
    return [(norm(m.group()), m.start(), m.end()) for m in _WORD.finditer(text)]


def passage_words(passage: str) -> list[str]:
    return [norm(w) for w in _WORD.findall(passage.rstrip("…").rstrip())]


def align(words: list[str], passage: str) -> tuple[int, int] | None:
    """The range [i, j) of ``words`` where ``passage`` lies, or None.

    The passage is contiguous on its page, so the longest run of words both share
    anchors it; the range is the passage's full length placed around that anchor
    (clamped to the page), which also covers words that differ at the edges."""
    wanted = passage_words(passage)
    if not wanted or not words:
        return None
    match = SequenceMatcher(None, words, wanted, autojunk=False).find_longest_match(
        0, len(words), 0, len(wanted))
    if match.size < min(MIN_ANCHOR_WORDS, len(wanted)):
        return None
    start = max(0, match.a - match.b)
    end = min(len(words), start + len(wanted))
    return start, end


def locate_passage(text: str, passage: str) -> tuple[int, int] | None:
    """Character offsets (start, end) of ``passage`` in a page's ``text``, or None."""
    spans = words_with_spans(text)
    found = align([w for w, _, _ in spans], passage)
    if found is None:
        return None
    i, j = found
    end = spans[j - 1][2]
    while end < len(text) and not text[end].isspace() and not text[end].isalnum():
        end += 1  # the sentence's closing punctuation belongs to the passage
    return spans[i][1], end


def locate_in_pdf_words(pdf_words: list[tuple], passage: str) -> list[int]:
    """Indices into pymupdf's ``page.get_text("words")`` tuples
    (x0, y0, x1, y1, word, block, line, word_no) that make up ``passage``."""
    tokens: list[str] = []
    owner: list[int] = []  # tokens[k] belongs to pdf_words[owner[k]] ("don't" is two tokens)
    for index, entry in enumerate(pdf_words):
        for w in _WORD.findall(entry[4]):
            tokens.append(norm(w))
            owner.append(index)
    found = align(tokens, passage)
    if found is None:
        return []
    i, j = found
    return sorted(set(owner[i:j]))


# ---- Structure of a text page -------------------------------------------------


@dataclass(frozen=True)
class Block:
    """A heading or a paragraph of a page: ``text[start:end]`` of the page's text."""

    kind: str  # "heading" | "paragraph"
    start: int
    end: int


def is_heading(paragraph: str) -> bool:
    """A Markdown heading, or one short line that does not read as a sentence."""
    if _MARKDOWN_HEADING.match(paragraph):
        return True
    if "\n" in paragraph or len(paragraph) > HEADING_MAX_CHARS:
        return False
    if len(paragraph.split()) > HEADING_MAX_WORDS or paragraph[-1] in ".,;:!?)\"'”":
        return False
    return paragraph[0].isupper() or paragraph[0].isdigit()


def page_blocks(text: str) -> list[Block]:
    """The page's paragraphs (blank-line separated) in order, headings marked;
    offsets exclude surrounding whitespace and a Markdown heading's '#'s."""
    blocks: list[Block] = []
    pos = 0
    for piece in [*_PARAGRAPH_BREAK.finditer(text), None]:
        end = piece.start() if piece else len(text)
        raw = text[pos:end]
        stripped = raw.strip()
        if stripped:
            start = pos + (len(raw) - len(raw.lstrip()))
            stop = start + len(stripped)
            if is_heading(stripped):
                marker = _MARKDOWN_HEADING.match(stripped)
                blocks.append(Block("heading", start + (marker.end() if marker else 0), stop))
            else:
                blocks.append(Block("paragraph", start, stop))
        if piece:
            pos = piece.end()
    return blocks
