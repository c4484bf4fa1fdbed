"""Reading real files of every format: whole Documents, checked page by page."""

import re
import zipfile
from pathlib import Path

import docx
import pymupdf
import pytest

from app.docs import PAGE_CHARS, SUPPORTED_SUFFIXES, Document, extract
from tests.docs.make_samples import make_docx, make_epub, make_html, make_pdf, make_text


def assert_offsets_consistent(document: Document) -> None:
    text = document.text
    assert [page.number for page in document.pages] == list(range(1, document.page_count + 1))
    for page in document.pages:
        assert text[page.start : page.start + len(page.text)] == page.text
        assert document.page_at(page.start) == page.number
        assert document.page_at(page.start + max(len(page.text) - 1, 0)) == page.number
    assert len(text) == sum(len(p.text) for p in document.pages) + 2 * (document.page_count - 1)


def test_supported_suffixes():
    assert SUPPORTED_SUFFIXES == frozenset(
        {".pdf", ".epub", ".txt", ".md", ".markdown", ".html", ".htm", ".docx"}
    )


# ---- PDF


def test_pdf_one_page_per_pdf_page(tmp_path):
    path = make_pdf(
        tmp_path / "report.pdf",
        ["Alpha page ALPHA-1\nsecond line of page one", "", "Gamma page GAMMA-3"],
        title="Quarterly Report",
        author="Ada Lovelace",
    )
    document = extract(path)
    assert (document.path, document.format, document.title, document.author) == (
        str(path), "pdf", "Quarterly Report", "Ada Lovelace"
    )
    # The blank PDF page stays a page, so page 3 is still called page 3.
    assert [page.text for page in document.pages] == [
        "Alpha page ALPHA-1\nsecond line of page one",
        "",
        "Gamma page GAMMA-3",
    ]
    assert_offsets_consistent(document)
    assert document.page_at(document.text.index("GAMMA-3")) == 3


def test_pdf_without_metadata_takes_its_first_line_as_title(tmp_path):
    document = extract(make_pdf(tmp_path / "notes.pdf", ["Meeting notes\nbody text"]))
    assert (document.title, document.author) == ("Meeting notes", "")


def test_pdf_ligatures_are_expanded(tmp_path):
    # Helvetica has no ligature glyphs; pymupdf's built-in Droid Sans Fallback has.
    pdf = pymupdf.open()
    page = pdf.new_page()
    page.insert_font(fontname="F0", fontbuffer=pymupdf.Font("cjk").buffer)
    page.insert_text((72, 72), "the \ufb01rst \ufb02oor", fontname="F0")
    pdf.save(tmp_path / "lig.pdf")
    assert "\ufb01" in pymupdf.open(tmp_path / "lig.pdf")[0].get_text()
    assert extract(tmp_path / "lig.pdf").pages[0].text == "the first floor"


def test_pdf_suffix_is_case_insensitive(tmp_path):
    document = extract(make_pdf(tmp_path / "UPPER.PDF", ["Upper case suffix"]))
    assert (document.format, document.page_count) == ("pdf", 1)


# ---- EPUB


def test_epub_chapters_in_spine_order(tmp_path):
    path = make_epub(
        tmp_path / "book.epub",
        [("Chapter One", "Alpha paragraph ALPHA.\n\nSecond paragraph."),
         ("Chapter Two", "Beta paragraph BETA.")],
        title="The Book",
        author="Ann Author",
    )
    document = extract(path)
    assert (document.format, document.title, document.author) == ("epub", "The Book", "Ann Author")
    # The nav document's table of contents is not read; short chapters do not share a page.
    assert [page.text for page in document.pages] == [
        "Chapter One\n\nAlpha paragraph ALPHA.\n\nSecond paragraph.",
        "Chapter Two\n\nBeta paragraph BETA.",
    ]
    assert_offsets_consistent(document)


def test_epub_long_chapter_is_cut_into_pages_at_paragraphs(tmp_path):
    paragraphs = [f"{n}" * 999 for n in range(1, 7)]  # 999 + 2 + 999 + 2 + 999 > 3000
    document = extract(make_epub(tmp_path / "long.epub", [("Long", "\n\n".join(paragraphs)),
                                                       ("Next", "After.")]))
    p = paragraphs
    assert [page.text for page in document.pages] == [
        f"Long\n\n{p[0]}\n\n{p[1]}",
        f"{p[2]}\n\n{p[3]}",
        f"{p[4]}\n\n{p[5]}",
        "Next\n\nAfter.",
    ]
    assert_offsets_consistent(document)


def test_epub_several_creators(tmp_path):
    path = make_epub(tmp_path / "two.epub", [("One", "Text.")], author="First Author")
    opf = _rewrite_member(path, "EPUB/content.opf", lambda xml: xml.replace(
        b"</metadata>", b'<dc:creator id="c2">Second Author</dc:creator></metadata>'
    ))
    assert b"Second Author" in opf
    assert extract(path).author == "First Author; Second Author"


# ---- DOCX


def test_docx_explicit_page_breaks_make_pages(tmp_path):
    path = make_docx(
        tmp_path / "memo.docx",
        ["Alpha para ALPHA.\n\nAlpha second para.", "Beta page BETA."],
        title="The Memo",
        author="Dee Writer",
        heading="Memo heading",
    )
    document = extract(path)
    assert (document.format, document.title, document.author) == ("docx", "The Memo", "Dee Writer")
    assert [page.text for page in document.pages] == [
        "Memo heading\n\nAlpha para ALPHA.\n\nAlpha second para.",
        "Beta page BETA.",
    ]
    assert_offsets_consistent(document)


def test_docx_title_from_heading_then_first_line(tmp_path):
    with_heading = make_docx(tmp_path / "h.docx", ["Body."], heading="The Heading")
    without = make_docx(tmp_path / "plain.docx", ["First line here\n\nBody."])
    assert (extract(with_heading).title, extract(with_heading).author) == ("The Heading", "")
    assert extract(without).title == "First line here"


def test_docx_without_core_properties_is_not_called_word_document(tmp_path):
    path = make_docx(tmp_path / "bare.docx", ["Body."], heading="Real Heading")
    _drop_core_properties(path)
    document = extract(path)
    assert (document.title, document.author) == ("Real Heading", "")


def test_docx_tables_breaks_and_page_break_before(tmp_path):
    document = docx.Document()
    document.core_properties.author = ""
    document.add_paragraph("Intro line\tafter tab")
    table = document.add_table(rows=2, cols=2)
    for row, cells in zip(table.rows, [("Name", "Value"), ("alpha", "42")]):
        for cell, text in zip(row.cells, cells):
            cell.text = text
    run = document.add_paragraph().add_run("line one")
    run.add_break()  # a line break, not a page break
    run.add_text("line two")
    document.add_paragraph("New page").paragraph_format.page_break_before = True
    document.save(tmp_path / "table.docx")

    result = extract(tmp_path / "table.docx")
    assert [page.text for page in result.pages] == [
        "Intro line\tafter tab\n\n| Name | Value |\n| alpha | 42 |\n\nline one\nline two",
        "New page",
    ]


def test_docx_without_page_breaks_is_cut_at_paragraphs(tmp_path):
    paragraphs = [f"{n}" * 999 for n in range(1, 5)]
    document = extract(make_docx(tmp_path / "long.docx", ["\n\n".join(paragraphs)]))
    p = paragraphs
    assert [page.text for page in document.pages] == [f"{p[0]}\n\n{p[1]}", f"{p[2]}\n\n{p[3]}"]


# ---- HTML


def test_html_drops_script_style_nav(tmp_path):
    path = make_html(
        tmp_path / "page.html",
        ["First para ALPHA.", "Second para BETA."],
        title="Page Title",
        author="Hal Author",
        heading="Main Heading",
    )
    document = extract(path)
    assert (document.format, document.title, document.author) == (
        "html", "Page Title", "Hal Author"
    )
    assert [page.text for page in document.pages] == [
        "Main Heading\n\nFirst para ALPHA.\n\nSecond para BETA."
    ]
    assert_offsets_consistent(document)


def test_html_title_falls_back_to_first_h1(tmp_path):
    document = extract(make_html(tmp_path / "page.htm", ["Body."], heading="Heading Title"))
    assert (document.format, document.title, document.author) == ("html", "Heading Title", "")


def test_html_declared_cp1252(tmp_path):
    path = make_html(tmp_path / "old.html", ["café “quoted”"], title="Old", encoding="cp1252")
    assert b"caf\xe9 \x93quoted\x94" in path.read_bytes()
    assert extract(path).pages[0].text == "café “quoted”"


def test_html_structure(tmp_path):
    path = tmp_path / "structure.html"
    path.write_text(
        "<html><body><h2>Section</h2><!-- COMMENT-NOISE -->Loose text"
        "<p>Inline <b>bold</b>\n   and <i>italic</i>.<br>After<script>NOISE</script> break.</p>"
        "<ul><li>one</li><li>two</li></ul>"
        "<table><tr><th>Key</th><th>Value</th></tr><tr><td>a</td><td>1</td></tr></table>"
        "<pre>code line\n    indented</pre>"
        "<div style='page-break-before: always'>Second page</div>"
        "<svg><title>SVG-NOISE</title></svg></body></html>",
        encoding="utf-8",
    )
    document = extract(path)
    assert [page.text for page in document.pages] == [
        (
            "Section\n\nLoose text\n\nInline bold and italic.\nAfter break.\n\none\n\ntwo\n\n| Key | Value |\n"
            "| a | 1 |\n\ncode line\n    indented"
        ),
        "Second page",
    ]
    assert document.title == "Section"  # no <title>, no <h1>: the first line


# ---- Markdown and plain text


def test_markdown_kept_as_written_title_from_first_h1(tmp_path):
    text = "```\n# not a title\n```\n\n# Real Title #\n\nSome *emphasis* text.\n\n## Sub\n\n- item"
    document = extract(make_text(tmp_path / "notes.md", text))
    assert (document.format, document.title, document.author) == ("md", "Real Title", "")
    assert [page.text for page in document.pages] == [text]


def test_markdown_front_matter(tmp_path):
    text = '---\ntitle: "Front Title"\nauthor: Fran\n---\n\n# Heading\n\nBody.'
    document = extract(make_text(tmp_path / "post.markdown", text))
    assert (document.format, document.title, document.author) == ("md", "Front Title", "Fran")


TEXT = "Title Line\n\ncafé “quoted” – naïve 漢字"


@pytest.mark.parametrize(
    ("encoding", "bom"),
    [("utf-8", False), ("utf-8", True), ("utf-16-le", True), ("utf-16-be", True),
     ("utf-32-le", True)],
)
def test_txt_encodings(tmp_path, encoding, bom):
    document = extract(make_text(tmp_path / "story.txt", TEXT, encoding, bom))
    assert (document.format, document.title, document.author) == ("txt", "Title Line", "")
    assert [page.text for page in document.pages] == [TEXT]


def test_txt_cp1252(tmp_path):
    path = tmp_path / "legacy.txt"
    path.write_bytes(b"caf\xe9 \x93quoted\x94\r\nnext line")
    assert [page.text for page in extract(path).pages] == ["café “quoted”\nnext line"]


def test_txt_form_feeds_are_pages(tmp_path):
    path = make_text(tmp_path / "pdftotext.txt", "Page one.\n\fPage two.\n\f\fPage four.\n\f")
    document = extract(path)
    assert [page.text for page in document.pages] == ["Page one.", "Page two.", "", "Page four."]
    assert_offsets_consistent(document)


def test_txt_long_text_pages_stay_under_page_chars(tmp_path):
    paragraphs = [" ".join(f"w{p}x{i}" for i in range(60)) for p in range(200)]
    document = extract(make_text(tmp_path / "long.txt", "\n\n".join(paragraphs)))
    assert document.page_count > 1
    assert all(len(page.text) <= PAGE_CHARS for page in document.pages)
    # Cut only between paragraphs: the joined text is the original.
    assert document.text == "\n\n".join(paragraphs)
    assert_offsets_consistent(document)


def test_title_falls_back_to_the_file_stem(tmp_path):
    document = extract(make_text(tmp_path / "long-first-line.txt", "word " * 30 + "\n\nmore"))
    assert document.title == "long-first-line"


def test_path_may_be_a_string(tmp_path):
    path = make_text(tmp_path / "s.txt", "hello")
    assert extract(str(path)).path == str(path)


# ---- helpers


def _rewrite_member(path: Path, member: str, change) -> bytes:
    with zipfile.ZipFile(path) as archive:
        members = [(info, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(path, "w") as archive:
        for info, data in members:
            if info.filename == member:
                data = change(data)
                changed = data
            archive.writestr(info, data)
    return changed


def _drop_core_properties(path: Path) -> None:
    with zipfile.ZipFile(path) as archive:
        members = [(info, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(path, "w") as archive:
        for info, data in members:
            if info.filename == "docProps/core.xml":
                continue
            if info.filename == "_rels/.rels":
                data = re.sub(rb"<Relationship [^>]*core-properties[^>]*/>", b"", data)
            archive.writestr(info, data)
