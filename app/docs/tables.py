"""Tables as text: one Markdown-style line per row, `| cell | cell |`, cells in order.

Shared by the PDF, DOCX and HTML readers, so a table reads the same from every format and a
row's cells stay on one line (one passage) instead of scattering one cell per line. For PDF,
pymupdf's table finder (Page.find_tables, ported from pdfplumber's, which follows Anssi
Nurminen's thesis on table detection in PDF) finds ruled tables; the page's other text is kept as pymupdf extracts it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import pymupdf

from app.docs.limits import TABLE_MIN_RULES

_CELL_SPACE = re.compile(r"\s+")


def markdown_row(cells: Iterable[str | None]) -> str:
    """`| a | b |`; a cell's own line breaks become spaces and its `|` is escaped."""
    cleaned = [_CELL_SPACE.sub(" ", cell or "").strip().replace("|", "\\|") for cell in cells]
    return "| " + " | ".join(cleaned) + " |"


def table_text(rows: Iterable[Iterable[str | None]]) -> str:
    """The rows of a table, one line each; rows without any text are left out."""
    lines = []
    for row in rows:
        cells = list(row)
        if any((cell or "").strip() for cell in cells):
            lines.append(markdown_row(cells))
    return "\n".join(lines)


# ---- PDF pages


def may_hold_table(page: pymupdf.Page) -> bool:
    """Cheap test before the costly finder (it only counts drawn items): enough ruling lines and
    rectangles."""
    rules = 0
    for path in page.get_cdrawings():
        rules += sum(1 for item in path.get("items", ()) if item[0] in ("l", "re", "qu"))
        if rules >= TABLE_MIN_RULES:
            return True
    return False


def _cell_texts(page: pymupdf.Page, table, flags: int) -> list[list[str]]:
    """Each cell's text as the rest of the page is extracted (same flags, ligatures folded):
    Table.extract() regroups characters itself and read "1.20" as "120 ." (pymupdf 2.0)."""
    rows = []
    for row in table.rows:
        rows.append([page.get_text("text", clip=pymupdf.Rect(cell), flags=flags) if cell else ""
                     for cell in row.cells])
    return rows


def pdf_text_with_tables(page: pymupdf.Page, flags: int) -> str | None:
    """The page's text with each table found on it as Markdown rows, or None when the page has
    no table (the caller then extracts its text as usual).

    Text lines inside a table's box are left out (the table holds them); each table is placed
    before the first text block that starts below the table's top, with a blank line on each
    side so that chunking keeps its rows together.
    """
    if not may_hold_table(page):
        return None
    tables = [t for t in page.find_tables().tables if t.row_count >= 1]
    rendered = [(pymupdf.Rect(t.bbox), table_text(_cell_texts(page, t, flags))) for t in tables]
    rendered = sorted((r for r in rendered if r[1]), key=lambda r: (r[0].y0, r[0].x0))
    if not rendered:
        return None
    blocks: list[tuple[float, str]] = []  # (top, text) of each text block outside the tables
    for block in page.get_text("dict", flags=flags)["blocks"]:
        lines = []
        for line in block.get("lines", ()):
            box = pymupdf.Rect(line["bbox"])
            middle = pymupdf.Point((box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2)
            if any(middle in rect for rect, _ in rendered):
                continue
            lines.append("".join(span["text"] for span in line["spans"]))
        if any(line.strip() for line in lines):
            blocks.append((block["bbox"][1], "\n".join(lines)))
    pieces: list[str] = []
    pending = list(rendered)
    for top, text in blocks:
        while pending and pending[0][0].y0 <= top:
            pieces.append("\n" + pending.pop(0)[1] + "\n")
        pieces.append(text)
    pieces.extend("\n" + table + "\n" for _, table in pending)
    return "\n".join(pieces)
