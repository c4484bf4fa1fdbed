"""EPUB reader: the spine's documents in reading order, each chapter cut into pages.

Read with zipfile and lxml rather than ebooklib: we need only the container, the package
document and the spine's XHTML, and reading them ourselves keeps every failure a clear reason
and lets the zip-bomb check run on the same open archive.
"""

from __future__ import annotations

import posixpath
import zipfile
from pathlib import Path
from urllib.parse import unquote

from lxml import etree

from app.docs.archive import corrupt_zip_refused, open_checked_zip
from app.docs.document import Extracted, Refused
from app.docs.limits import MAX_TEXT_BYTES
from app.docs.markup import decode_markup, html_body_text, parse_html
from app.docs.text import clean_title, paginate

_HTML_TYPES = {"application/xhtml+xml", "text/html", "application/xml", "text/xml"}


def extract_epub(path: Path, size: int) -> Extracted:
    with open_checked_zip(path, "EPUB") as archive, corrupt_zip_refused("EPUB"):
        package_path = _package_path(archive)
        package = _parse_xml(archive, package_path, "package document")
        title = clean_title(_first_text(package, "title"))
        # "; " because a creator is often written "Last, First".
        author = "; ".join(
            name for name in (clean_title(node.text) for node in _all(package, "creator")) if name
        )
        chapters = _spine_paths(package, posixpath.dirname(package_path))
        _check_text_size(archive, chapters)
        pages: list[str] = []
        for chapter_path in chapters:
            pages.extend(paginate(_chapter_text(archive, chapter_path)))
    return Extracted(pages=pages, title=title, author=author)


def _package_path(archive: zipfile.ZipFile) -> str:
    container = _parse_xml(archive, "META-INF/container.xml", "container")
    for rootfile in _all(container, "rootfile"):
        full_path = rootfile.get("full-path")
        if full_path:
            return full_path
    raise Refused("not a valid EPUB (META-INF/container.xml names no package document)")


def _spine_paths(package: etree._Element, base: str) -> list[str]:
    """Archive paths of the spine's (X)HTML documents in reading order.

    Non-linear items (notes, answer keys) are kept: they are part of the book's text, and
    questions are asked of the whole book.
    """
    manifest = {
        item.get("id"): (item.get("href") or "", item.get("media-type") or "")
        for item in _all(package, "item")
    }
    paths = []
    for itemref in _all(package, "itemref"):
        href, media_type = manifest.get(itemref.get("idref"), ("", ""))
        if href and media_type in _HTML_TYPES:
            paths.append(posixpath.normpath(posixpath.join(base, unquote(href.split("#")[0]))))
    return paths


def _check_text_size(archive: zipfile.ZipFile, chapters: list[str]) -> None:
    """The chapters are read whole and their text kept: bound them as an HTML file is."""
    sizes = {info.filename: info.file_size for info in archive.infolist()}
    total = sum(sizes.get(path, 0) for path in set(chapters))
    if total > MAX_TEXT_BYTES:
        raise Refused(
            f"the book's chapters are {total / 2**20:.0f} MB of XHTML; books over "
            f"{MAX_TEXT_BYTES // 2**20} MB of text are not read (split it into smaller files)"
        )


def _chapter_text(archive: zipfile.ZipFile, chapter_path: str) -> str:
    try:
        data = archive.read(chapter_path)
    except KeyError:
        raise Refused(
            f"chapter {chapter_path} is listed in the book's spine but missing from the file; "
            "the EPUB is damaged"
        ) from None
    return html_body_text(parse_html(decode_markup(data)))


def _parse_xml(archive: zipfile.ZipFile, member: str, what: str) -> etree._Element:
    try:
        size = archive.getinfo(member).file_size
    except KeyError:
        raise Refused(f"not a valid EPUB ({what} {member} is missing)") from None
    if size > MAX_TEXT_BYTES:  # a package document is kilobytes; this one would be parsed whole
        raise Refused(f"not a valid EPUB ({what} {member} is {size / 2**20:.0f} MB)")
    data = archive.read(member)
    # No DTDs, no entity expansion, no network: an EPUB is untrusted XML (XXE, billion
    # laughs). A parser per call because lxml parsers must not be shared between threads.
    parser = etree.XMLParser(
        resolve_entities=False, no_network=True, load_dtd=False, recover=True, huge_tree=False
    )
    try:
        root = etree.fromstring(data, parser) if data.strip() else None
    except etree.XMLSyntaxError:
        root = None
    if root is None:
        raise Refused(f"not a valid EPUB ({what} {member} is not readable XML)")
    return root


# EPUB 2 and 3 use different namespaces for the same elements, so match by local name.
def _all(root: etree._Element, local_name: str) -> list[etree._Element]:
    return root.xpath(f"//*[local-name() = '{local_name}']")


def _first_text(root: etree._Element, local_name: str) -> str:
    for node in _all(root, local_name):
        if node.text and node.text.strip():
            return node.text
    return ""
