"""Zip archives (EPUB, DOCX): open one only after checking what it would expand to."""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app.docs.document import Refused, brief
from app.docs.limits import MAX_ZIP_BYTES, MAX_ZIP_RATIO, ZIP_RATIO_MIN_BYTES


def open_checked_zip(path: Path, kind: str) -> zipfile.ZipFile:
    """Open `path` as a zip archive whose declared sizes are safe to extract.

    The central directory's sizes can be trusted as limits: zipfile stops reading a member at
    its declared size and fails on a CRC mismatch, so a member cannot expand past what we check.
    """
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as error:
        raise Refused(
            f"file is truncated or not a valid {kind} (it is not a readable zip archive: {error})"
        ) from None
    try:
        check_expanded_size(archive.infolist())
    except Refused:
        archive.close()
        raise
    return archive


@contextmanager
def corrupt_zip_refused(kind: str) -> Iterator[None]:
    """Report a member that cannot be extracted (bad CRC, broken deflate stream, a header that
    disagrees with the directory) as damage to the file, which it is, not as a crash."""
    try:
        yield
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, OSError) as error:
        raise Refused(
            f"file is damaged: part of the {kind}'s zip archive cannot be extracted "
            f"({brief(error)}); get a fresh copy of the file"
        ) from None


def check_expanded_size(members: list[zipfile.ZipInfo]) -> None:
    expanded = sum(member.file_size for member in members)
    compressed = sum(member.compress_size for member in members)
    if expanded > MAX_ZIP_BYTES:
        raise Refused(
            f"archive would expand to {expanded / 2**20:.0f} MB (limit "
            f"{MAX_ZIP_BYTES // 2**20} MB); refused as a suspected zip bomb"
        )
    ratio = expanded / max(compressed, 1)
    if expanded > ZIP_RATIO_MIN_BYTES and ratio > MAX_ZIP_RATIO:
        raise Refused(
            f"archive is compressed {ratio:.0f}:1 (limit {MAX_ZIP_RATIO}:1); refused as a "
            "suspected zip bomb"
        )
