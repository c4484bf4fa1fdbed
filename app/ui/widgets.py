"""Small widget helpers the panes share."""
from __future__ import annotations

from PySide6.QtWidgets import QLabel, QSizePolicy


def info_label(text: str = "", name: str = "", wrap: bool = True) -> QLabel:
    """A label for text of any length (paths, titles, reasons): it takes the width the
    layout gives it and never makes the window wider (a long path cannot wrap)."""
    label = QLabel(text)
    if name:
        label.setObjectName(name)
    label.setWordWrap(wrap)
    label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
    label.setMinimumWidth(40)
    return label
