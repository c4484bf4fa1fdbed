"""Small widget helpers the panes share."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QPainter
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


class ElidedLabel(QLabel):
    """One line that ends in "…" when the layout gives it less room than its text needs;
    ``text()`` stays whole (the tooltip can carry the details)."""

    def __init__(self, text: str = "", name: str = ""):
        super().__init__(text)
        if name:
            self.setObjectName(name)
        self.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.setMinimumWidth(40)

    def paintEvent(self, event) -> None:
        rect = self.contentsRect()
        shown = self.fontMetrics().elidedText(self.text(), Qt.ElideRight, rect.width())
        painter = QPainter(self)
        self.style().drawItemText(painter, rect, self.alignment() | Qt.AlignVCenter, self.palette(),
                                  self.isEnabled(), shown, self.foregroundRole())
        painter.end()
