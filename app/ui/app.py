"""Starting the desktop application (or rendering it to a PNG)."""
from __future__ import annotations

import os
import sys

from app.settings import Paths


def _has_display() -> bool:
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")) or sys.platform != "linux"


def run_gui(paths: Paths, screenshot: str | None = None) -> int:
    if screenshot or not _has_display():
        if not screenshot and not os.environ.get("QT_QPA_PLATFORM"):
            print("ellm: no display found (DISPLAY / WAYLAND_DISPLAY unset). Start eLLM on a desktop, "
                  "run it under a virtual screen (xvfb-run ellm), or use the command-line subcommands "
                  "(ellm --help). `ellm gui --screenshot FILE` renders the window to a PNG.", file=sys.stderr)
            return 1
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    from app.session import Session
    from app.ui.main_window import MainWindow
    from app.ui.resources import load_stylesheet

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("eLLM")
    app.setStyleSheet(load_stylesheet())
    window = MainWindow(Session(paths), read_ahead=not screenshot)   # a screenshot reads nothing
    if screenshot:
        return save_screenshot(app, window, screenshot)
    install_excepthook(window)
    window.show()
    return app.exec()


def install_excepthook(window) -> None:
    """An unexpected error in a slot becomes a readable message in the window (the
    traceback goes to stderr only) instead of ending the application."""
    import traceback

    def hook(kind, value, tb):
        traceback.print_exception(kind, value, tb)
        window.show_error(f"Unexpected error: {value or kind.__name__}")

    sys.excepthook = hook


def save_screenshot(app, window, path: str) -> int:
    """Show the window with the most recent conversation (if any), the viewer on its last
    answer's first citation, and save it as a PNG."""
    window.resize(1200, 760)
    window.show()
    app.processEvents()
    window.show_latest_thread()
    for _ in range(5):
        app.processEvents()
    window.viewer.fit_width()  # the layout has settled: render the page at the final width
    app.processEvents()
    ok = window.grab().save(path, "PNG")
    window.close()
    if not ok:
        print(f"ellm: error: {path}: cannot write the screenshot", file=sys.stderr)
        return 1
    print(path)
    return 0
