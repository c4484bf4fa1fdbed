"""Every way a file can fail to be read ends in a DocumentError whose reason says what to do."""

import io
import random
import zipfile
from pathlib import Path

import pytest

from app.docs import SUPPORTED_SUFFIXES, Document, DocumentError, extract
from tests.docs.make_samples import (
    make_docx,
    make_encrypted_pdf,
    make_epub,
    make_pdf,
    make_scanned_pdf,
    make_text,
    make_truncated_pdf,
)


def reason(path) -> str:
    with pytest.raises(DocumentError) as caught:
        extract(path)
    error = caught.value
    assert (error.path, str(error)) == (str(path), f"{path}: {error.reason}")
    return error.reason


# ---- Any format


@pytest.mark.parametrize("suffix", sorted(SUPPORTED_SUFFIXES))
def test_empty_file(tmp_path, suffix):
    path = tmp_path / f"empty{suffix}"
    path.write_bytes(b"")
    assert reason(path) == "file is empty"


def test_unsupported_suffix(tmp_path):
    path = tmp_path / "sheet.xyz"
    path.write_bytes(b"data")
    assert reason(path) == "unsupported file type .xyz"
    assert reason(tmp_path / "README") == "unsupported file type (no suffix)"


def test_missing_file_and_folder(tmp_path):
    assert reason(tmp_path / "gone.pdf") == "file not found"
    (tmp_path / "folder.pdf").mkdir()
    assert reason(tmp_path / "folder.pdf") == "not a regular file (a folder?)"


@pytest.mark.parametrize("suffix", sorted(SUPPORTED_SUFFIXES))
def test_random_bytes_never_escape_as_another_exception(tmp_path, suffix):
    rng = random.Random(suffix)
    for size in (1, 7, 300, 5000):
        path = tmp_path / f"noise{size}{suffix}"
        path.write_bytes(bytes(rng.randrange(256) for _ in range(size)))
        try:
            extract(path)
        except DocumentError:
            pass


@pytest.mark.parametrize("kind", ["pdf", "epub", "docx"])
def test_damaged_files_never_escape_as_another_exception(tmp_path, kind):
    good = tmp_path / f"good.{kind}"
    if kind == "pdf":
        make_pdf(good, ["First page text.", "Second page text."], title="T")
    elif kind == "epub":
        make_epub(good, [("One", "Alpha."), ("Two", "Beta.")])
    else:
        make_docx(good, ["Alpha.", "Beta."], title="T")
    data = good.read_bytes()
    rng = random.Random(kind)
    for trial in range(25):
        damaged = bytearray(data)
        for _ in range(rng.randrange(1, 20)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        if trial % 2:  # and cut short
            damaged = damaged[: rng.randrange(len(damaged) // 2, len(damaged))]
        path = tmp_path / f"damaged{trial}.{kind}"
        path.write_bytes(bytes(damaged))
        try:
            assert isinstance(extract(path), Document)
        except DocumentError:
            pass


# ---- PDF


def test_encrypted_pdf(tmp_path):
    path = make_encrypted_pdf(tmp_path / "locked.pdf", ["Secret text."])
    assert reason(path) == "PDF is encrypted; remove the password and ingest it again"


def test_truncated_pdf(tmp_path):
    path = make_truncated_pdf(tmp_path / "half.pdf")
    assert reason(path).startswith("file is truncated or not a valid PDF (pymupdf: ")


def test_nearly_complete_pdf_that_mupdf_repairs_is_still_refused(tmp_path):
    # MuPDF opens this one by repairing it; without the %%EOF check some pages would come
    # back blank and nobody would know.
    path = make_truncated_pdf(tmp_path / "cut.pdf", keep=0.95)
    assert reason(path) == (
        "file is truncated or not a valid PDF (pymupdf: the file is damaged and has no %%EOF "
        "at its end; it was probably cut short while copying or downloading)"
    )


def test_not_a_pdf(tmp_path):
    path = tmp_path / "fake.pdf"
    path.write_bytes(b"This is a text file with the wrong suffix.")
    assert reason(path) == (
        f"file is truncated or not a valid PDF (pymupdf: Failed to open file '{path}' as "
        "type pdf.)"
    )


def test_scanned_pdf(tmp_path):
    path = make_scanned_pdf(tmp_path / "scan.pdf")
    # Drawings only: no text layer, and OCR finds no letters in the page image either.
    assert reason(path) == (
        "no extractable text (no text layer, and OCR recognised no text in the page images)"
    )


# ---- EPUB and DOCX archives


@pytest.mark.parametrize("suffix", [".epub", ".docx"])
def test_not_a_zip(tmp_path, suffix):
    path = tmp_path / f"fake{suffix}"
    path.write_bytes(b"plain text, not a zip archive")
    kind = suffix[1:].upper()
    assert reason(path) == (
        f"file is truncated or not a valid {kind} (it is not a readable zip archive: "
        "File is not a zip file)"
    )


def test_truncated_epub(tmp_path):
    path = make_epub(tmp_path / "cut.epub", [("One", "Alpha.")])
    path.write_bytes(path.read_bytes()[:-200])  # the central directory is at the end
    assert reason(path).startswith("file is truncated or not a valid EPUB")


@pytest.mark.parametrize("suffix", [".epub", ".docx"])
def test_zip_bomb_by_ratio(tmp_path, suffix):
    path = tmp_path / f"bomb{suffix}"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("mimetype", "application/epub+zip")
        archive.writestr("filler.xml", b"\0" * (20 * 2**20))  # deflates about 1000:1
    assert path.stat().st_size < 100_000
    assert reason(path).endswith(":1 (limit 100:1); refused as a suspected zip bomb")


def test_zip_over_the_size_limit(tmp_path, monkeypatch):
    monkeypatch.setattr("app.docs.archive.MAX_ZIP_BYTES", 1000)
    path = make_epub(tmp_path / "big.epub", [("One", "Alpha. " * 300)])
    assert reason(path) == (
        "archive would expand to 0 MB (limit 0 MB); refused as a suspected zip bomb"
    )


def test_zip_member_that_fails_its_checksum(tmp_path):
    path = make_epub(tmp_path / "flipped.epub", [("One", "Alpha MARKER text.")])
    _store_uncompressed(path)
    data = path.read_bytes()
    assert data.count(b"MARKER") == 1
    path.write_bytes(data.replace(b"MARKER", b"MARKEX"))
    assert reason(path) == (
        "file is damaged: part of the EPUB's zip archive cannot be extracted (Bad CRC-32 for "
        "file 'EPUB/chapter1.xhtml'); get a fresh copy of the file"
    )


def test_password_protected_docx(tmp_path):
    path = tmp_path / "locked.docx"
    # Word writes an encrypted .docx as an OLE compound file; its header is enough here.
    path.write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(504))
    assert reason(path) == (
        "DOCX is password-protected or is an old binary .doc renamed; remove the password (or "
        "save it as .docx in Word) and ingest it again"
    )


def test_epub_without_container(tmp_path):
    path = tmp_path / "bare.epub"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("mimetype", "application/epub+zip")
    assert reason(path) == "not a valid EPUB (container META-INF/container.xml is missing)"


def test_epub_with_a_missing_chapter(tmp_path):
    path = make_epub(tmp_path / "holed.epub", [("One", "Alpha."), ("Two", "Beta.")])
    _remove_member(path, "EPUB/chapter2.xhtml")
    assert reason(path) == (
        "chapter EPUB/chapter2.xhtml is listed in the book's spine but missing from the file; "
        "the EPUB is damaged"
    )


def test_epub_of_images_only(tmp_path):
    path = make_epub(tmp_path / "pictures.epub", [("", "")])
    assert reason(path) == (
        "no extractable text (only images? books of scanned pages need OCR first)"
    )


def test_docx_without_a_document_part(tmp_path):
    path = make_docx(tmp_path / "hollow.docx", ["Alpha."])
    _remove_member(path, "word/document.xml")
    assert reason(path).startswith("not a Word document that can be read (")


def test_empty_docx(tmp_path):
    path = make_docx(tmp_path / "blank.docx", [""])
    assert reason(path) == "no extractable text (only images or empty paragraphs?)"


# ---- Text formats


def test_binary_data_named_txt(tmp_path):
    rng = random.Random(3)
    path = tmp_path / "noise.txt"
    path.write_bytes(bytes(rng.randrange(256) for _ in range(4096)))
    assert reason(path) == (
        "file is binary data, not text (if it is UTF-16 text without a byte-order mark, "
        "save it as UTF-8)"
    )


def test_whitespace_only_txt(tmp_path):
    path = make_text(tmp_path / "blank.md", " \n\n\t\n")
    assert reason(path) == "no extractable text (the file holds only whitespace or markup)"


def test_html_with_only_scripts(tmp_path):
    path = tmp_path / "app.html"
    path.write_text(
        "<html><head><script>var x = 1;</script></head><body><nav>Menu</nav></body></html>"
    )
    assert reason(path) == "no extractable text (the file holds only whitespace or markup)"


@pytest.mark.parametrize(
    ("module", "suffix", "kind"), [("plain", ".txt", "text files"), ("markup", ".html", "HTML")]
)
def test_text_file_over_the_size_limit(tmp_path, monkeypatch, module, suffix, kind):
    monkeypatch.setattr(f"app.docs.{module}.MAX_TEXT_BYTES", 2**20)
    path = tmp_path / f"huge{suffix}"
    path.write_bytes(b"word\n" * (2 * 2**20 // 5))  # 2 MiB
    assert reason(path) == (
        f"file is 2 MB; {kind} over 1 MB {'are' if kind == 'text files' else 'is'} not read "
        "(split it into smaller files)"
    )


# ---- helpers


def _store_uncompressed(path: Path) -> None:
    with zipfile.ZipFile(path) as archive:
        members = [(info.filename, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, data in members:
            archive.writestr(name, data)


def _remove_member(path: Path, member: str) -> None:
    with zipfile.ZipFile(path) as archive:
        members = [(info, archive.read(info)) for info in archive.infolist()]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for info, data in members:
            if info.filename != member:
                archive.writestr(info, data)
    path.write_bytes(buffer.getvalue())
