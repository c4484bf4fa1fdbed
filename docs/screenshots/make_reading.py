"""Make docs/screenshots/reading.png and asking.png: the library with its reading states
(read, reading NN %, not read) while documents are read ahead in the background, and an answer
in progress whose document is being read for it (the progress bar with tokens and time left).

    QT_QPA_PLATFORM=offscreen .venv/bin/python docs/screenshots/make_reading.py [OUT_DIR]

Uses eLLM's engine with the automatic settings and the default test model (SmolLM2-135M), so it
runs in a minute or two on two cores.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARAGRAPH = ("The harbour authority keeps a record of every barge that passes the east lock, with its cargo, "
             "its owner and the hour it entered. ")


def wait(app, until, timeout: float = 600.0) -> None:
    end = time.monotonic() + timeout
    while not until():
        if time.monotonic() > end:
            raise TimeoutError("the window did not reach the state to photograph")
        app.processEvents()
        time.sleep(0.02)


def main(out_dir: Path) -> int:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from tests.docs.make_samples import make_text

    work = Path(tempfile.mkdtemp(prefix="ellm-reading-"))
    library = work / "Harbour"
    library.mkdir()
    make_text(library / "lock-log-2022.txt", "Lock log 2022\n\n" + PARAGRAPH * 40)
    make_text(library / "lock-log-2023.txt", "Lock log 2023\n\n" + PARAGRAPH * 400)
    make_text(library / "lock-log-2024.txt", "Lock log 2024\n\n" + PARAGRAPH * 600)
    make_text(library / "visitors.txt", "Visitor information\n\nThe lighthouse is open on summer weekends.\n")
    data = work / "data"
    ellm = [sys.executable, "-m", "app", "--data-dir", str(data)]
    subprocess.run([*ellm, "ingest", str(library)], check=True)
    subprocess.run([*ellm, "read", "lock-log-2022.txt", "visitors.txt", "--engine", "ellm"], check=True)

    from PySide6.QtWidgets import QApplication

    from app.session import Session
    from app.settings import Paths, Settings
    from app.ui.main_window import MainWindow
    from app.ui.resources import load_stylesheet

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setStyleSheet(load_stylesheet())
    session = Session(Paths.resolve(data))
    session.save_settings(Settings(engine="ellm", max_tokens=48, temperature=0.0))
    window = MainWindow(session, read_ahead=True)
    window.resize(1200, 760)
    window.centralWidget().setSizes([560, 240, 400])   # room for the library's Read column
    window.show()
    states = {}
    window.reader.sig_state.connect(lambda doc, state: states.__setitem__(doc, state))
    wait(app, lambda: any(s.startswith("reading ") and "left" in s for s in states.values()))
    window.library.table.selectRow(0)
    for _ in range(20):
        app.processEvents()
    out_dir.mkdir(parents=True, exist_ok=True)
    window.grab().save(str(out_dir / "reading.png"), "PNG")

    # A question about the document not read yet: reading ahead yields, the answer reads it first.
    window.toggle_reading()
    last = window.session.store.find_documents("lock-log-2024.txt")[0]["id"]
    window.library.select_id(last)
    window.ask_pane.question.setText("Which records does the harbour authority keep?")
    window.ask_pane._ask()
    wait(app, lambda: window.ask_pane.reading.isVisible() and window.ask_pane.reading.value() > 0
         and "left" in window.ask_pane.stats.text())
    for _ in range(20):
        app.processEvents()
    window.grab().save(str(out_dir / "asking.png"), "PNG")
    window.stop()
    window.close()
    print(out_dir / "reading.png", out_dir / "asking.png")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "screenshots"))
