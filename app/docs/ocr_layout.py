"""From OCR segments to page text: reading order, paragraphs, word boxes, and the spaces the
recogniser left out.

PP-OCRv4's recognition model was trained mostly on Chinese, where lines have no spaces; on
English it often runs words together ("Boatspay", whole lines of them in 10 pt Helvetica).
The page image still shows where words end: a column of background wider than the gaps between
letters. split_at_gaps finds those columns and puts the missing spaces back.
"""

from __future__ import annotations

import statistics
import unicodedata
from dataclasses import dataclass

import numpy as np

from app.docs.document import WordBox

PARAGRAPH_GAP = 1.8
"""Lines further apart than this many median line heights (top to top) start a paragraph."""

INK_CONTRAST = 60
"""A pixel this much darker (0-255 grey) than its line's median is ink, not background."""

WORD_GAP_SEPARATION = 2.0
"""Gaps are split into letter gaps and word gaps only when the word gaps are on average at
least this many times wider; a page whose gaps do not fall in two such groups keeps the
recogniser's spaces alone."""

MIN_GAPS = 8  # fewer gaps on a page than this are too few to tell the two kinds apart


@dataclass(frozen=True)
class Segment:
    """One run of text the detector found, in page pixels."""

    box: tuple[float, float, float, float]  # x0, y0, x1, y1
    chars: tuple[tuple[str, float, float], ...]  # (char, x0, x1) per recognised character



# ---- Page text and word boxes -------------------------------------------------------


def layout(segments: list[Segment], scale: float) -> tuple[str, tuple[WordBox, ...]]:
    """Page text in reading order (top to bottom, left to right within a line) and its words.

    Segments whose vertical middles fall inside one another form a line; a gap between lines
    over PARAGRAPH_GAP median line heights starts a paragraph (a blank line), as pymupdf's
    blocks do. `scale` turns pixels into PDF points. Characters are NFKC-folded ("，" -> ",").
    """
    lines = _lines(segments)
    if not lines:
        return "", ()
    height = statistics.median(_bottom(line) - _top(line) for line in lines)
    text_parts: list[str] = []
    words: list[WordBox] = []
    block, line_no, previous_top = 0, 0, None
    for line in lines:
        top = _top(line)
        if previous_top is not None:
            if top - previous_top > PARAGRAPH_GAP * height:
                block, line_no = block + 1, 0
                text_parts.append("\n\n")
            else:
                line_no += 1
                text_parts.append("\n")
        previous_top = top
        word_no = 0
        for k, segment in enumerate(line):
            if k:
                text_parts.append(" ")
            for word, x0, x1 in _words(segment):
                # A hundredth of a point is finer than any highlight; it keeps the JSON short.
                words.append((round(x0 * scale, 2), round(segment.box[1] * scale, 2),
                              round(x1 * scale, 2), round(segment.box[3] * scale, 2),
                              word, block, line_no, word_no))
                word_no += 1
            text_parts.append(" ".join(w for w, _, _ in _words(segment)))
    return "".join(text_parts), tuple(words)


def _lines(segments: list[Segment]) -> list[list[Segment]]:
    lines: list[list[Segment]] = []
    for segment in sorted(segments, key=lambda s: (s.box[1], s.box[0])):
        middle = (segment.box[1] + segment.box[3]) / 2
        if lines and _top(lines[-1]) <= middle <= _bottom(lines[-1]):
            lines[-1].append(segment)
        else:
            lines.append([segment])
    return [sorted(line, key=lambda s: s.box[0]) for line in lines if any(_words(s) for s in line)]


def _top(line: list[Segment]) -> float:
    return min(s.box[1] for s in line)


def _bottom(line: list[Segment]) -> float:
    return max(s.box[3] for s in line)


def _words(segment: Segment) -> list[tuple[str, float, float]]:
    """(word, x0, x1) in pixels for the whitespace-separated words of a segment."""
    found: list[tuple[str, float, float]] = []
    current, x0, x1 = "", 0.0, 0.0
    for char, c0, c1 in segment.chars:
        folded = unicodedata.normalize("NFKC", char)
        if not folded.strip():
            if current:
                found.append((current, x0, x1))
            current = ""
            continue
        if not current:
            x0 = c0
        current, x1 = current + folded.strip(), c1
    if current:
        found.append((current, x0, x1))
    return found


# ---- Spaces the recogniser left out -----------------------------------------------


def split_at_gaps(segments: list[Segment], image: np.ndarray) -> list[Segment]:
    """`segments` with a space added between two characters wherever the image has a word gap
    between them. image: (height, width, 3) uint8 RGB of the page the segments are in.

    Gap widths, as fractions of their line's height, fall in two groups, between letters and
    between words; Otsu's threshold (Otsu 1979, "A threshold selection method from gray-level
    histograms") separates them. Spaces are added only between two letters or a letter and a
    digit: measured on 10 pt text, gaps next to digits ("1" is narrow on a wide advance) and
    punctuation were as wide as word gaps, and the recogniser spaced those right anyway.
    """
    if not segments:
        return segments
    grey = image.mean(axis=2, dtype=np.float32)  # (height, width) float32
    gaps = [_gaps(segment, grey) for segment in segments]
    widths = [(g1 - g0) / _height(s) for s, found in zip(segments, gaps) for g0, g1 in found]
    threshold = _word_gap_threshold(widths)
    if threshold is None:
        return segments
    return [_with_spaces(s, [g for g in found if (g[1] - g[0]) / _height(s) >= threshold])
            for s, found in zip(segments, gaps)]


def _height(segment: Segment) -> float:
    return max(1.0, segment.box[3] - segment.box[1])


def _gaps(segment: Segment, grey: np.ndarray) -> list[tuple[int, int]]:
    """(x0, x1) of each run of background columns with ink on both sides, in page pixels."""
    height, width = grey.shape
    x0, y0 = max(0, int(segment.box[0])), max(0, int(segment.box[1]))
    x1, y1 = min(width, int(np.ceil(segment.box[2]))), min(height, int(np.ceil(segment.box[3])))
    if x1 - x0 < 2 or y1 - y0 < 2:
        return []
    crop = grey[y0:y1, x0:x1]  # (line height, line width) float32
    ink = (crop < np.median(crop) - INK_CONTRAST).any(axis=0)  # (line width,) bool
    columns = np.flatnonzero(ink)
    if len(columns) < 2:
        return []
    steps = np.diff(columns)  # a step over 1 jumps a run of background columns
    return [(x0 + int(columns[i]) + 1, x0 + int(columns[i + 1])) for i in np.flatnonzero(steps > 1)]


def _word_gap_threshold(widths: list[float]) -> float | None:
    if len(widths) < MIN_GAPS:
        return None
    ordered = np.sort(np.asarray(widths, dtype=np.float64))  # (n,) float64
    n = len(ordered)
    below = np.arange(1, n)  # (n - 1,): how many gaps fall below a cut after each one
    total = np.cumsum(ordered)  # (n,)
    low = total[:-1] / below  # (n - 1,) mean width below each cut
    high = (total[-1] - total[:-1]) / (n - below)  # (n - 1,) mean width above it
    between = below * (n - below) * (high - low) ** 2  # (n - 1,) Otsu's between-class variance
    between[ordered[1:] == ordered[:-1]] = -1.0  # a cut between equal widths is no cut
    cut = int(np.argmax(between))
    if between[cut] < 0 or high[cut] < WORD_GAP_SEPARATION * max(low[cut], 1e-6):
        return None
    return float(ordered[cut] + ordered[cut + 1]) / 2


def _spaceable(left: str, right: str) -> bool:
    return (left.isalpha() and right.isalnum()) or (left.isalnum() and right.isalpha())


def _with_spaces(segment: Segment, gaps: list[tuple[int, int]]) -> Segment:
    if not gaps:
        return segment
    middles = [(g0 + g1) / 2 for g0, g1 in gaps]
    chars: list[tuple[str, float, float]] = []
    for index, (char, c0, c1) in enumerate(segment.chars):
        chars.append((char, c0, c1))
        if index + 1 == len(segment.chars):
            break
        following, f0, f1 = segment.chars[index + 1]
        if not _spaceable(char, following):
            continue
        if any((c0 + c1) / 2 < middle < (f0 + f1) / 2 for middle in middles):
            chars.append((" ", c1, f0))
    return Segment(segment.box, tuple(chars))
