"""Sizes and limits for reading documents, in one table so they are tuned in one place."""

# ---- Pagination
PAGE_CHARS = 3000
"""Target size of a page for formats without real pages (EPUB chapters, TXT, MD, HTML, DOCX).
Pages are the unit of citation, so they should be about what a person reads as one page."""

MAX_EXPLICIT_PAGE_CHARS = 4 * PAGE_CHARS
"""A page cut by an explicit break (form feed, DOCX page break) longer than this is split again:
a file with one page break in 300 pages of text would otherwise give citations that point
nowhere useful. Real printed pages (pdftotext output) stay well under it."""

TITLE_MAX_CHARS = 120
"""A first heading or line longer than this is prose, not a title."""

# ---- Memory guards
MAX_TEXT_BYTES = 32 * 2**20
"""TXT, MD and HTML files are read whole; decoding, normalising and chunking take several
times their size, so this bounds ingestion's memory (README, "Reliability and privacy").
32 MB of text is about 8 million tokens, a thousand times the default context: a file that
large is an export or a dump that is better split anyway."""

MAX_ZIP_BYTES = 512 * 2**20
"""EPUB and DOCX are zip archives: refuse one that would expand past this."""

MAX_ZIP_RATIO = 100
"""Documents compress 3-15x; a higher ratio than this is a suspected zip bomb..."""

ZIP_RATIO_MIN_BYTES = 2**20
"""...once the archive expands to more than this, below which expanding it is harmless anyway
(a tiny file of repeated markup can compress past the ratio legitimately)."""

BINARY_CONTROL_SHARE = 0.01
"""A text file whose decoded characters are more than this share control characters is binary
data (or UTF-16 without a byte-order mark), not text."""

# ---- OCR and tables (app/docs/ocr.py, app/docs/tables.py)
OCR_DPI = 150
"""Scanned pages are rendered at this resolution, one page at a time, for OCR. On pages of
9-14 pt text RapidOCR's PP-OCRv4 models read every word at 150 dpi and ran words together
more often at 200 dpi (measured on pymupdf-rendered Helvetica, Times and Courier), and an
A4 page is 1240 x 1754 pixels, 6.5 MB of RGB."""

OCR_MAX_SIDE_PX = 4000
"""A page whose longer side would render larger than this (a poster, a map) is rendered
smaller, so one page's image stays under 48 MB whatever the page size."""

OCR_MIN_TEXT_CHARS = 8
"""A PDF page with fewer non-space characters in its text layer than this has no real text
layer (a scan with at most a stamped page number): it is OCRed. Pages with more are never."""

TABLE_MIN_RULES = 4
"""pymupdf's table finder is slow next to reading a page's text, so it runs only on pages whose
drawings hold at least this many lines or rectangles: a ruled table has at least that many."""
