"""DOCX reader: body paragraphs and tables (Markdown rows) in order; explicit page breaks cut pages.

Word does not store its rendered page layout, only the breaks a person inserted
(w:br w:type="page", "page break before" on a paragraph). w:lastRenderedPageBreak is a cache
of the last layout by whichever program saved the file, often stale or absent, so only
explicit breaks count; text without them is cut into PAGE_CHARS pages like plain text.
"""

from __future__ import annotations

from pathlib import Path

import docx
from docx.opc.constants import RELATIONSHIP_TYPE
from docx.opc.exceptions import PackageNotFoundError
from lxml import etree

from app.docs.archive import corrupt_zip_refused, open_checked_zip
from app.docs.document import Extracted, Refused, brief
from app.docs.limits import MAX_TEXT_BYTES
from app.docs.tables import table_text
from app.docs.text import clean_title, normalise, paginate, short_title

_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_MC_FALLBACK = "{http://schemas.openxmlformats.org/markup-compatibility/2006}Fallback"
_TITLE_STYLES = {"Title", "Heading 1"}
_TITLE_SEARCH_PARAGRAPHS = 200


# Word saves a password-protected document, and wrote every pre-2007 .doc, as an OLE
# compound file rather than a zip archive.
_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"


def extract_docx(path: Path, size: int) -> Extracted:
    with open(path, "rb") as file:
        if file.read(len(_OLE_MAGIC)) == _OLE_MAGIC:
            raise Refused(
                "DOCX is password-protected or is an old binary .doc renamed; remove the "
                "password (or save it as .docx in Word) and ingest it again"
            )
    with open_checked_zip(path, "DOCX") as archive:
        # python-docx parses the XML parts whole into lxml trees, several times their size.
        largest = max((info for info in archive.infolist() if info.filename.endswith(".xml")),
                      key=lambda info: info.file_size, default=None)
    if largest is not None and largest.file_size > MAX_TEXT_BYTES:
        raise Refused(
            f"the document's {largest.filename} is {largest.file_size / 2**20:.0f} MB of XML; "
            f"documents over {MAX_TEXT_BYTES // 2**20} MB are not read (split it into smaller files)"
        )
    with corrupt_zip_refused("DOCX"):
        try:
            document = docx.Document(str(path))
        except PackageNotFoundError:
            raise Refused("file is truncated or not a valid DOCX (not a Word package)") from None
        except (KeyError, ValueError) as error:
            # python-docx: a missing part (KeyError) or another Office type, e.g. a .docm or
            # .dotx renamed (ValueError naming the content type).
            raise Refused(f"not a Word document that can be read ({brief(error)})") from None

    body = document.element.body
    # mc:AlternateContent holds the same content twice (a modern Choice and a Fallback for old
    # readers); drop the fallback copies or text boxes would be read twice.
    for fallback in list(body.iter(_MC_FALLBACK)):
        fallback.getparent().remove(fallback)

    text = normalise("\n\n".join(_block_text(block) for block in _blocks(body)))
    title, author = _core_properties(document)
    return Extracted(pages=paginate(text), title=title, heading=_heading(document), author=author)


def _blocks(body: etree._Element):
    """Top-level paragraphs and tables in document order, looking through content controls
    (w:sdt, used for tables of contents and forms) and custom XML wrappers."""
    stack = list(reversed(body))
    while stack:
        element = stack.pop()
        if element.tag in (_W + "p", _W + "tbl"):
            yield element
        elif element.tag in (_W + "sdt", _W + "sdtContent", _W + "customXml"):
            stack.extend(reversed(element))


def _block_text(block: etree._Element) -> str:
    if block.tag == _W + "tbl":
        return _table_text(block)
    return _paragraph_text(block)


def _paragraph_text(paragraph: etree._Element) -> str:
    """Text of a paragraph with "\\f" for its explicit page breaks."""
    parts = []
    properties = paragraph.find(_W + "pPr")
    if properties is not None:
        before = properties.find(_W + "pageBreakBefore")
        if before is not None and before.get(_W + "val", "true") not in ("0", "false", "off"):
            parts.append("\f")
    for element in paragraph.iter(_W + "t", _W + "tab", _W + "br", _W + "cr", _W + "noBreakHyphen"):
        tag = element.tag
        if tag == _W + "t":
            parts.append(element.text or "")
        elif tag == _W + "tab":
            # w:tab also appears in w:pPr/w:tabs as a tab-stop definition, which is no text.
            if element.getparent().tag != _W + "tabs":
                parts.append("\t")
        elif tag == _W + "br":
            parts.append("\f" if element.get(_W + "type") == "page" else "\n")
        elif tag == _W + "cr":
            parts.append("\n")
        else:
            parts.append("-")
    return "".join(parts)


def _table_text(table: etree._Element) -> str:
    """One Markdown-style line per row (app.docs.tables), empty cells kept so columns line up.
    Page breaks inside cells are not pages."""
    rows = []
    for row in table.iterchildren(_W + "tr"):  # a nested table's rows are part of its cell
        rows.append([" ".join(" ".join(_paragraph_text(p) for p in cell.iter(_W + "p")).split())
                     for cell in row.iterchildren(_W + "tc")])
    return table_text(rows)


def _core_properties(document) -> tuple[str, str]:
    # python-docx invents properties (title "Word Document") for a package without them, so
    # first ask whether the file has any.
    try:
        document.part.package.part_related_by(RELATIONSHIP_TYPE.CORE_PROPERTIES)
    except KeyError:
        return "", ""
    properties = document.core_properties
    return clean_title(properties.title), clean_title(properties.author)


def _heading(document) -> str:
    for index, paragraph in enumerate(document.paragraphs):
        if index >= _TITLE_SEARCH_PARAGRAPHS:
            break
        try:
            style = paragraph.style.name if paragraph.style is not None else ""
        except (KeyError, ValueError, AttributeError):
            style = ""  # a paragraph naming a style the file does not define
        if style in _TITLE_STYLES and paragraph.text.strip():
            return short_title(paragraph.text)
    return ""
