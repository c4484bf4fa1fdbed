"""OCR of PDF pages that have no text layer (scans), offline.

RapidOCR (rapidocr_onnxruntime) runs PaddleOCR's PP-OCRv4 detection and recognition models on
onnxruntime; the models ship inside its wheel, so nothing is downloaded, ever. Where it is not
installed and Tesseract is, pymupdf's own OCR (Page.get_textpage_ocr) is used instead.

A page is rendered alone at OCR_DPI, recognised and released before the next, so a scan of
thousands of pages takes the memory of one. The recognised words keep their boxes, in PDF
points and in pymupdf's word-tuple shape, so a citation on a scanned page is highlighted as on
any other PDF page (app.library.passages.locate_in_pdf_words).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np
import pymupdf

from app.docs.document import WordBox, brief
from app.docs.limits import OCR_DPI, OCR_MAX_SIDE_PX
from app.docs.ocr_layout import Segment, layout, split_at_gaps

NOTHING_RECOGNISED = "OCR recognised no text on the page"



@dataclass(frozen=True)
class Recognised:
    text: str
    words: tuple[WordBox, ...]
    note: str = ""  # why the page could not be (fully) recognised, for a person
    ocred: bool = False  # OCR was tried on the page (not for a blank page or without an engine)


# ---- Engines ------------------------------------------------------------------


class RapidEngine:
    """RapidOCR without its angle classifier: on clean upright scans it turned whole lines
    180 degrees and lost them (one line in four on a 14 pt test page); pages scanned upside
    down or sideways are therefore not read."""

    def __init__(self) -> None:
        # OpenCV's Qt build may point Qt at its own plugins when imported: keep the app's.
        saved = {k: v for k, v in os.environ.items() if k.startswith("QT_")}
        try:
            from rapidocr_onnxruntime import RapidOCR
        finally:
            for key in [k for k in os.environ if k.startswith("QT_")]:
                if key not in saved:
                    del os.environ[key]
            os.environ.update(saved)
        # det_limit_type "max": detect at the rendered size (up to 2000 px a side) instead of
        # scaling the image up until its shorter side is 736 px; upscaled detection gave line
        # crops on which the recogniser ran English words together (a quarter of the words
        # on a 160 pt high strip of 10 pt text, none of them at the rendered size).
        self._ocr = RapidOCR(use_cls=False, print_verbose=False, det_limit_type="max")

    def segments(self, image: np.ndarray) -> list[Segment]:
        """image: (height, width, 3) uint8 RGB."""
        result, _ = self._ocr(image, use_cls=False, return_word_box=True)
        found = []
        for item in result or []:
            polygon, text = item[0], item[1]
            xs, ys = [p[0] for p in polygon], [p[1] for p in polygon]
            box = (min(xs), min(ys), max(xs), max(ys))
            chars = _char_boxes(text, box, item[3] if len(item) > 4 else None,
                                item[4] if len(item) > 4 else None)
            found.append(Segment(box, chars))
        return found


def _char_boxes(text, box, boxes, chars) -> tuple[tuple[str, float, float], ...]:
    """Per-character horizontal extents: RapidOCR's own (return_word_box) when they match the
    text, else the segment's width shared out evenly."""
    if boxes and chars and len(boxes) == len(chars) and "".join(chars) == text:
        return tuple((c, min(p[0] for p in b), max(p[0] for p in b)) for c, b in zip(chars, boxes))
    x0, x1 = box[0], box[2]
    step = (x1 - x0) / max(1, len(text))
    return tuple((c, x0 + i * step, x0 + (i + 1) * step) for i, c in enumerate(text))


_engine_lock = threading.Lock()
_engine: RapidEngine | None = None
_engine_problem = ""


def rapid_engine() -> tuple[RapidEngine | None, str]:
    """The shared RapidOCR engine (its models load once, not per page), or None and why not."""
    global _engine, _engine_problem
    with _engine_lock:
        if _engine is None and not _engine_problem:
            try:
                _engine = RapidEngine()
            except ImportError:
                _engine_problem = "OCR is not installed (pip install rapidocr_onnxruntime)"
            except Exception as error:  # a broken onnxruntime install, missing model file
                _engine_problem = f"OCR could not start ({type(error).__name__}: {brief(error)})"
        return _engine, _engine_problem


def tesseract_available() -> bool:
    try:
        return bool(pymupdf.get_tessdata())
    except Exception:  # pymupdf raises RuntimeError when it finds no tessdata folder
        return False


# ---- Recognising one page -------------------------------------------------------


def recognise_page(page: pymupdf.Page, dpi: int = OCR_DPI) -> Recognised:
    """The text of `page` read from its image. Never raises: a page that cannot be rendered or
    recognised comes back empty with a note. The page is rendered before the engine is asked
    for, so a blank or damaged page never loads the models (~370 MB)."""
    zoom = min(dpi / 72, OCR_MAX_SIDE_PX / max(page.rect.width, page.rect.height, 1))
    pymupdf.TOOLS.mupdf_warnings(reset=True)
    try:
        pixmap = page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), colorspace=pymupdf.csRGB,
                                 alpha=False)
    except Exception as error:  # MuPDF raises RuntimeError and friends for a broken page
        return Recognised("", (), f"the page image cannot be rendered ({brief(error)})", True)
    damage = _image_damage(pymupdf.TOOLS.mupdf_warnings(reset=True))
    try:
        if damage:  # what was rendered is MuPDF's padding, not the scan: do not read noise
            return Recognised("", (), damage, True)
        if pixmap.is_unicolor:  # a blank page: nothing to read, nothing wrong; not OCRed
            return Recognised("", ())
        engine, problem = rapid_engine()
        if engine is None:
            if tesseract_available():
                return _tesseract_page(page, dpi)
            return Recognised("", (), problem)
        image = np.frombuffer(pixmap.samples, dtype=np.uint8).reshape(
            pixmap.height, pixmap.width, 3)  # (height, width, 3) uint8 RGB, no copy
        segments = split_at_gaps(engine.segments(image), image)
    except Exception as error:  # onnxruntime or OpenCV refusing this image
        return Recognised("", (), f"OCR failed on the page image ({type(error).__name__}: "
                                  f"{brief(error)})", True)
    finally:
        del pixmap
        pymupdf.TOOLS.store_shrink(100)  # drop MuPDF's cached decoded images of this page
    text, words = layout(segments, 1 / zoom)
    return Recognised(text, words, "" if text else NOTHING_RECOGNISED, True)


def _image_damage(warnings: str) -> str:
    errors = [line for line in warnings.splitlines() if "error" in line.lower()]
    return f"the page image is damaged (mupdf: {brief('; '.join(errors))})" if errors else ""


def _tesseract_page(page: pymupdf.Page, dpi: int) -> Recognised:
    try:
        textpage = page.get_textpage_ocr(dpi=dpi, full=True)
        text = page.get_text("text", textpage=textpage).strip()
        words = tuple(tuple(w) for w in page.get_text("words", textpage=textpage))
    except Exception as error:
        return Recognised("", (), f"Tesseract OCR failed ({brief(error)})", True)
    return Recognised(text, words, "" if text else NOTHING_RECOGNISED, True)
