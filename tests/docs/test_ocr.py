"""OCR of scanned PDF pages: text on the right pages, word boxes where the words are drawn,
text-layer pages never OCRed, damaged images and missing engines noted per page."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pymupdf
import pytest

from app.docs import ExtractCancelled, ExtractWatch, ocr, extract
from app.docs.limits import OCR_DPI, OCR_MAX_SIDE_PX
from app.docs.ocr_layout import Segment, layout, split_at_gaps
from app.library.passages import locate_in_pdf_words, norm
from tests.docs.make_samples import (
    make_damaged_image_pdf,
    make_image_only_pdf,
    make_pdf,
)

# Phrases in plain 10 pt Helvetica, one distinctive set per page.
PAGES = [
    "Born digital: the harbour treaty was signed in 1848 by both river towns.",
    "The lighthouse keeper kept a dog named Argos.\nBoats pay a small fee at the northern gate.",
    "Page three tells of the granary and its seven towers.\nThe miller paid in barley.",
]


def squeezed(text: str) -> str:
    """Casefolded, without whitespace: the recogniser sometimes runs two English words together
    ("Boatspay"), which is a flaw of its model, not of where the text was put."""
    return "".join(norm(text).split())


@pytest.fixture(scope="module")
def scan(tmp_path_factory):
    """Page 1 keeps its text layer; pages 2 and 3 are images only. Read once (OCR ~3 s/page)."""
    folder = tmp_path_factory.mktemp("scan")
    path = make_image_only_pdf(folder / "scan.pdf", PAGES, text_pages=(1,), height=160)
    source = make_pdf(folder / "source.pdf", PAGES)  # the same pages with their words' boxes
    progress = []
    document = extract(path, ExtractWatch(progress=lambda *event: progress.append(event)))
    return document, progress, source


def test_scanned_pages_are_ocred_and_their_phrases_found_on_the_right_pages(scan):
    document, progress, _ = scan
    assert [p.source for p in document.pages] == ["text", "ocr", "ocr"]
    assert document.ocr_pages == [2, 3]
    assert [p.note for p in document.pages] == ["", "", ""]
    for number, phrase in [(2, "kept a dog named Argos"), (2, "at the northern gate"),
                           (3, "the granary and its seven towers"), (3, "The miller paid in barley")]:
        found = [p.number for p in document.pages if squeezed(phrase) in squeezed(p.text)]
        assert found == [number], (phrase, [p.text for p in document.pages])
    # one line of the page image is one line of text, in reading order, words spaced
    assert document.pages[2].text.splitlines() == [
        "Page three tells of the granary and its seven towers.", "The miller paid in barley."]
    # the page offsets of the document still index its joined text
    page = document.pages[2]
    assert document.text[page.start: page.start + len(page.text)] == page.text
    # per-page progress, only for the pages that were OCRed
    assert progress == [(1, 3, "OCR page 2 of 3"), (2, 3, "OCR page 3 of 3")]


def test_recognised_words_have_the_boxes_of_the_words_on_the_page(scan):
    """A citation on a scanned page finds its words among the OCR words, on the line where
    they are; and a recognised word's box is where the original PDF drew it (within 3 pt)."""
    document, _, source = scan
    page = document.pages[1]
    hits = locate_in_pdf_words(list(page.words), "The lighthouse keeper kept a dog named Argos.")
    assert hits and squeezed("".join(page.words[i][4] for i in hits)) == squeezed(
        "The lighthouse keeper kept a dog named Argos.")
    assert {page.words[i][6] for i in hits} == {0}  # the first line of the page
    with pymupdf.open(source) as original:
        drawn = original[1].get_text("words")
    unique = {w[4]: w[:4] for w in drawn if [d[4] for d in drawn].count(w[4]) == 1}
    compared = [(w[:4], unique[w[4]]) for w in page.words if w[4] in unique]
    assert len(compared) >= 0.7 * len(drawn)  # most words recognised exactly
    for box, expected in compared:
        assert max(abs(a - b) for a, b in zip(box, expected)) < 3, (box, expected)


def test_a_page_with_a_text_layer_is_never_ocred(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(ocr, "recognise_page", lambda page, dpi=OCR_DPI: calls.append(page))
    document = extract(make_pdf(tmp_path / "text.pdf", ["A page of real text.", "Another one."]))
    assert calls == [] and document.ocr_pages == []


def test_a_damaged_page_image_is_stored_empty_with_a_reason(tmp_path):
    document = extract(make_damaged_image_pdf(tmp_path / "damaged.pdf", "The first page is fine."))
    assert [p.text for p in document.pages] == ["The first page is fine.", ""]
    assert document.pages[1].source == "ocr"
    assert document.pages[1].note.startswith("the page image is damaged (mupdf: ")
    assert "jpeg" in document.pages[1].note.lower()


def test_without_an_ocr_engine_a_scan_is_refused_with_the_reason(tmp_path, monkeypatch):
    problem = "OCR is not installed (pip install rapidocr_onnxruntime)"
    monkeypatch.setattr(ocr, "rapid_engine", lambda: (None, problem))
    monkeypatch.setattr(ocr, "tesseract_available", lambda: False)
    from app.docs import DocumentError

    with pytest.raises(DocumentError) as refused:
        extract(make_image_only_pdf(tmp_path / "scan.pdf", ["Words only in the image."]))
    assert refused.value.reason == (
        "no extractable text (no text layer, and OCR recognised no text in the page images; "
        f"{problem})")


class FakeEngine:
    """Records the images it is given and 'recognises' one word per page."""

    def __init__(self):
        self.shapes = []

    def segments(self, image):
        self.shapes.append(image.shape)
        return [Segment((10, 10, 50, 30), tuple((c, 10 + 10 * i, 20 + 10 * i)
                                                    for i, c in enumerate("word")))]


def test_pages_are_rendered_one_at_a_time_at_a_fixed_dpi_and_a_bounded_size(tmp_path, monkeypatch):
    engine = FakeEngine()
    monkeypatch.setattr(ocr, "rapid_engine", lambda: (engine, ""))
    path = make_image_only_pdf(tmp_path / "scan.pdf", ["one", "two"], dpi=50)
    with pymupdf.open(path) as document:  # a third page the size of a poster (2 x 3 m)
        poster = document.new_page(width=5670, height=8500)
        poster.draw_rect(pymupdf.Rect(100, 100, 900, 900), fill=(0, 0, 0))
        document.save(tmp_path / "big.pdf")
    result = extract(tmp_path / "big.pdf")
    for height, width, channels in engine.shapes[:2]:  # A4 at OCR_DPI, to the pixel
        assert abs(height - 842 * OCR_DPI / 72) <= 1 and abs(width - 595 * OCR_DPI / 72) <= 1
        assert channels == 3
    assert max(engine.shapes[2][:2]) <= OCR_MAX_SIDE_PX
    assert [p.text for p in result.pages] == ["word", "word", "word"]


def test_cancel_stops_between_pages(tmp_path, monkeypatch):
    engine = FakeEngine()
    monkeypatch.setattr(ocr, "rapid_engine", lambda: (engine, ""))
    path = make_image_only_pdf(tmp_path / "scan.pdf", ["one", "two", "three"], dpi=50)
    done = []
    watch = ExtractWatch(progress=lambda *event: done.append(event), cancel=lambda: len(done) >= 1)
    with pytest.raises(ExtractCancelled):
        extract(path, watch)
    assert len(engine.shapes) == 1 and done == [(0, 3, "OCR page 1 of 3")]


def test_layout_orders_lines_and_numbers_words_like_pymupdf():
    def segment(x0, y0, text):
        return Segment((x0, y0, x0 + 10 * len(text), y0 + 20),
                           tuple((c, x0 + 10 * i, x0 + 10 * i + 8) for i, c in enumerate(text)))

    # Given out of order: a line in two segments, a second line, then a paragraph further down.
    segments = [segment(300, 102, "right half"), segment(0, 300, "New paragraph"),
                segment(0, 100, "Left，half"), segment(0, 125, "next line")]
    text, boxes = layout(segments, scale=0.5)
    assert text == "Left,half right half\nnext line\n\nNew paragraph"
    assert boxes == (
        (0.0, 50.0, 44.0, 60.0, "Left,half", 0, 0, 0),
        (150.0, 51.0, 174.0, 61.0, "right", 0, 0, 1),
        (180.0, 51.0, 199.0, 61.0, "half", 0, 0, 2),
        (0.0, 62.5, 19.0, 72.5, "next", 0, 1, 0),
        (25.0, 62.5, 44.0, 72.5, "line", 0, 1, 1),
        (0.0, 150.0, 14.0, 160.0, "New", 1, 0, 0),
        (20.0, 150.0, 64.0, 160.0, "paragraph", 1, 0, 1),
    )


def strip_image(letters: str, gaps: list[int], height: int = 30) -> tuple:
    """A white strip with a black 8 px bar per character, separated by `gaps` pixels, and the
    segment a recogniser that dropped every space would return for it."""
    width = 10 + 8 * len(letters) + sum(gaps) + 10
    image = np.full((height + 20, width, 3), 255, dtype=np.uint8)  # (height, width, 3) uint8
    x, chars = 10, []
    for i, letter in enumerate(letters):
        image[15:15 + height - 10, x:x + 8] = 0
        chars.append((letter, x, x + 8))
        x += 8 + (gaps[i] if i < len(gaps) else 0)
    return image, Segment((5, 10, x + 5, 10 + height), tuple(chars))


def test_word_gaps_in_the_image_put_back_the_spaces_the_recogniser_dropped():
    # letter gaps of 1-2 px, word gaps of 8 px (a line 30 px high), a digit pair far apart
    image, segment = strip_image("Boatspayafee12", [1, 2, 1, 1, 8, 1, 2, 8, 2, 1, 2, 8, 8])
    [fixed] = split_at_gaps([segment], image)
    assert "".join(c for c, _, _ in fixed.chars) == "Boats pay afee 12"  # "a fee": a 2 px gap
    assert layout([fixed], 1.0)[0] == "Boats pay afee 12"
    # the added space spans the gap between the letters it separates
    assert [(c0, c1) for c, c0, c1 in fixed.chars if c == " "] == [(55, 63), (90, 98), (135, 143)]


def test_gaps_of_one_width_are_left_alone():
    """Monospaced letters: every gap the same, no word gaps to tell apart."""
    image, segment = strip_image("abcdefghijkl", [4] * 11)
    assert split_at_gaps([segment], image) == [segment]


def test_starting_the_engine_leaves_qt_settings_alone():
    """OpenCV, which RapidOCR imports, points QT_QPA_PLATFORM_PLUGIN_PATH at its own Qt build;
    the app's Qt must keep finding its own plugins. A fresh process, so OpenCV really loads."""
    code = ("import os; before = {k: v for k, v in os.environ.items() if k.startswith('QT_')}; "
            "from app.docs.ocr import RapidEngine; RapidEngine(); import cv2; "
            "after = {k: v for k, v in os.environ.items() if k.startswith('QT_')}; "
            "print(before == after, sorted(after))")
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    env.pop("QT_QPA_PLATFORM_PLUGIN_PATH", None)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120, check=False)
    assert run.stdout.strip() == "True ['QT_QPA_PLATFORM']", run.stderr


@pytest.mark.skipif(not ocr.tesseract_available(), reason="Tesseract is not installed here")
def test_tesseract_reads_a_scan_when_rapidocr_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(ocr, "rapid_engine", lambda: (None, "OCR is not installed"))
    document = extract(make_image_only_pdf(tmp_path / "scan.pdf", [PAGES[1]], height=160))
    assert document.ocr_pages == [1] and document.pages[0].words
    assert squeezed("kept a dog named Argos") in squeezed(document.pages[0].text)
