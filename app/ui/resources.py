"""Finding the files in resources/ (stylesheet, icons)."""
from __future__ import annotations

from pathlib import Path

RESOURCES = Path(__file__).resolve().parents[2] / "resources"


def resource_path(name: str) -> Path:
    return RESOURCES / name


def load_stylesheet() -> str:
    p = resource_path("style.qss")
    return p.read_text(encoding="utf-8") if p.is_file() else ""
