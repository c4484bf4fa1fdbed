"""Tables read as Markdown rows, one line per row, from PDF, DOCX and HTML."""

from __future__ import annotations

import docx
import pymupdf

from app.docs import extract
from app.docs.tables import markdown_row, table_text
from app.library.ingest import chunk_page
from tests.docs.make_samples import make_pdf, make_table_pdf, make_text

ROWS = [["Name", "Price", "Qty"], ["apple", "1.20", "4"], ["pear", "0.90", "12"]]
MARKDOWN = "| Name | Price | Qty |\n| apple | 1.20 | 4 |\n| pear | 0.90 | 12 |"


def test_markdown_rows_escape_bars_and_fold_line_breaks():
    assert markdown_row(["a|b", " two\nlines ", None, ""]) == "| a\\|b | two lines |  |  |"
    assert table_text([["x", "y"], ["", None], ["1", ""]]) == "| x | y |\n| 1 |  |"


def test_a_drawn_pdf_table_keeps_its_rows_together_in_the_page_text(tmp_path):
    path = make_table_pdf(tmp_path / "prices.pdf", "Prices at the market", ROWS,
                          "Prices change every week.")
    document = extract(path)
    assert document.pages[0].text == f"Prices at the market\n\n{MARKDOWN}\n\nPrices change every week."
    # the offsets citations use still point at the rows in the document's text
    start = document.pages[0].start + document.pages[0].text.index("| apple")
    assert document.text[start: start + 22] == "| apple | 1.20 | 4 |\n|"
    assert document.page_at(start) == 1
    # a passage (chunk) holds the whole table
    assert any(MARKDOWN in document.pages[0].text[s:e] for s, e in chunk_page(document.pages[0].text))


def test_a_table_on_a_later_page_and_text_pages_do_not_pay_for_the_table_finder(tmp_path, monkeypatch):
    calls = []
    real = pymupdf.Page.find_tables
    monkeypatch.setattr(pymupdf.Page, "find_tables", lambda self, *a, **k: (calls.append(self.number),
                                                                            real(self, *a, **k))[1])
    table = make_table_pdf(tmp_path / "table.pdf", "Stock", ROWS, "End.")
    merged = pymupdf.open(make_pdf(tmp_path / "text.pdf", ["Only words on this page."]))
    with pymupdf.open(table) as other:
        merged.insert_pdf(other)
    merged.save(tmp_path / "both.pdf")
    document = extract(tmp_path / "both.pdf")
    assert calls == [1]  # the finder ran on the ruled page only
    assert document.pages[0].text == "Only words on this page."
    assert document.pages[1].text == f"Stock\n\n{MARKDOWN}\n\nEnd."


def test_docx_table_rows_keep_empty_cells_in_their_columns(tmp_path):
    document = docx.Document()
    document.add_paragraph("Before the table")
    table = document.add_table(rows=3, cols=3)
    for row, cells in zip(table.rows, [("Name", "Price", "Qty"), ("apple", "", "4"), ("pear", "0.90", "12")]):
        for cell, text in zip(row.cells, cells):
            cell.text = text
    document.add_paragraph("After the table")
    document.save(tmp_path / "table.docx")
    assert extract(tmp_path / "table.docx").pages[0].text == (
        "Before the table\n\n| Name | Price | Qty |\n| apple |  | 4 |\n| pear | 0.90 | 12 |\n\n"
        "After the table")


def test_html_table_rows_stay_together_with_paragraphs_inside_cells(tmp_path):
    html = ("<html><body><p>Before</p><table><thead><tr><th>Name</th><th>Note</th></tr></thead>"
            "<tbody><tr><td><p>apple</p></td><td><p>red</p><p>sweet<br>crisp</p></td></tr>"
            "<tr><td>pear</td><td><ul><li>green</li><li>soft</li></ul></td></tr></tbody></table>"
            "<p>After</p></body></html>")
    path = make_text(tmp_path / "t.html", html)
    assert extract(path).pages[0].text == (
        "Before\n\n| Name | Note |\n| apple | red sweet crisp |\n| pear | green soft |\n\nAfter")
