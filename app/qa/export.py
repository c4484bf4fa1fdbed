"""Exporting a summary (or an answer) to Markdown, PDF and DOCX."""
from __future__ import annotations

import html
import os
import tempfile
from datetime import date
from pathlib import Path

FORMATS = ("md", "pdf", "docx")


class ExportError(Exception):
    pass


def format_for(path: str | os.PathLike, explicit: str | None = None) -> str:
    fmt = (explicit or Path(path).suffix.lstrip(".") or "md").lower()
    if fmt == "markdown":
        fmt = "md"
    if fmt not in FORMATS:
        raise ExportError(f"{path}: cannot export as '{fmt}'; choose md, pdf or docx")
    return fmt


def to_markdown(title: str, body: str, source: str = "", method: str = "") -> str:
    meta = [f"Source: {source}" if source else "", f"Method: {method}" if method else "",
            f"Date: {date.today().isoformat()}"]
    head = "  \n".join(m for m in meta if m)
    return f"# Summary: {title}\n\n{head}\n\n{body.strip()}\n"


def _paragraphs(body: str) -> list[str]:
    return [p.strip() for p in body.replace("\r\n", "\n").split("\n\n") if p.strip()]


def write_pdf(path: Path, title: str, body: str, source: str = "") -> None:
    import pymupdf

    parts = [f"<h1>Summary: {html.escape(title)}</h1>"]
    if source:
        parts.append(f"<p><i>Source: {html.escape(source)}</i></p>")
    parts += [f"<p>{html.escape(p)}</p>" for p in _paragraphs(body)]
    story = pymupdf.Story(html="".join(parts))
    writer = pymupdf.DocumentWriter(str(path))
    page = pymupdf.paper_rect("a4")
    where = page + (56, 56, -56, -56)
    more = True
    while more:
        device = writer.begin_page(page)
        more, _ = story.place(where)
        story.draw(device)
        writer.end_page()
    writer.close()


def write_docx(path: Path, title: str, body: str, source: str = "") -> None:
    import docx

    d = docx.Document()
    d.core_properties.title = f"Summary: {title}"
    d.add_heading(f"Summary: {title}", level=1)
    if source:
        d.add_paragraph(f"Source: {source}").italic = True
    for p in _paragraphs(body):
        d.add_paragraph(p)
    d.save(str(path))


def export(path: str | os.PathLike, title: str, body: str, fmt: str | None = None, source: str = "",
           method: str = "") -> Path:
    """Write ``body`` to ``path``; written to a temporary name then renamed, so a
    failure never leaves half a file where a good one was."""
    path = Path(path)
    fmt = format_for(path, fmt)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        if fmt == "md":
            Path(tmp).write_text(to_markdown(title, body, source, method), encoding="utf-8")
        elif fmt == "pdf":
            write_pdf(Path(tmp), title, body, source)
        else:
            write_docx(Path(tmp), title, body, source)
        os.replace(tmp, path)
    except OSError as e:
        raise ExportError(f"{path}: cannot write the file ({e.strerror or e})") from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
