"""Make docs/screenshots/reading.png and asking.png.

reading.png: the library while documents are read ahead in the background: the Read column with
a read document's cache size on disk ("read, 31 MiB"), the one being read ("reading 21 %, 2 min
left") and the next one's place in the reading order ("no, #2"), the caches' total against their
budget below the table, and a conversation about a read document in the ask pane.

asking.png: a question about a document that is not read yet, answered at once from its best
passages (the note says so) while reading ahead reads that document next, in the background.

    QT_QPA_PLATFORM=offscreen .venv/bin/python docs/screenshots/make_reading.py [OUT_DIR]

Uses the app's automatic settings (eLLM's engine, which keeps each read document's cache in a
file) with the default model Qwen2.5-Coder-1.5B-Instruct, linked as make_main.py links it, and
greedy decoding. Two to four minutes on two cores, more when eLLM's kernels are compiled first.
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_main import link_model  # noqa: E402  (the same model, found the same way)

READ_FIRST = "What did the inspectors find at the east lock?"           # about a read document
NOT_READ_YET = "When did the east lock reopen, and which barge went through first?"  # one not read yet
READ_COLUMN_WIDTH = 170   # the Read column dragged wider, so "reading 21 %, 2 min left" shows whole

BARGES = ["Maria", "Johanna", "Rhinestar", "Albatros", "De Hoop", "Stella Maris", "Willem II", "Nordstern",
          "Fortuna", "Amstel", "Vrouwe Anna"]
OWNERS = ["Van Dijk Shipping", "Rijnvaart BV", "Hansa Barges", "Molenaar & Zn.", "the grain cooperative",
          "Riverside Timber"]
CARGO = ["grain", "timber", "gravel", "coal", "sugar beet", "fertiliser", "containers", "sand"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
LEAD = ("The harbour authority keeps a record of every barge that passes its locks: its name, its owner, its "
        "cargo and the hour it entered the lock. The lock keepers write each passage in this log.")
# One event a year that the passages around it do not repeat: what the questions ask about.
EVENTS = {
    2022: (10, 3, "the east lock was closed for the day for the inspection of its gates. The inspectors found rot "
                  "in the lower wooden gates and advised that they be replaced within two years."),
    2024: (5, 14, "the east lock reopened after the renewal of its gates. The first barge through the new gates "
                  "was the Korenbloem of the grain cooperative, with 800 tonnes of grain, greeted by the mayor."),
}


def lock_log(year: int, entries: int) -> str:
    """A year of the lock keepers' log: ``entries`` passages, the same for the same year."""
    rng = random.Random(year)
    out = [f"Lock log {year}", LEAD]
    event_month, event_day, event = EVENTS.get(year, (0, 0, ""))
    for m, month in enumerate(MONTHS, 1):
        out.append(f"{month} {year}")
        days = []
        for day in sorted(rng.randint(1, 28) for _ in range(entries // 12)):
            hour, minute = rng.randint(5, 21), rng.choice((0, 10, 15, 20, 30, 40, 45, 50))
            lock = "west" if year == 2024 and (m, day) < (5, 14) else "east"   # the east lock's new gates
            days.append((day, f"{day} {month}, {hour:02d}:{minute:02d}: the barge {rng.choice(BARGES)} of "
                              f"{rng.choice(OWNERS)} entered the {lock} lock "
                              f"{rng.choice(('upstream', 'downstream'))} with {rng.randint(4, 30) * 50:,} tonnes "
                              f"of {rng.choice(CARGO)}."))
        if m == event_month:
            days.append((event_day, f"{event_day} {month}: {event}"))
        out += [text for _, text in sorted(days, key=lambda d: d[0])]
    return "\n\n".join(out) + "\n"


def wait(app, until, what: str, timeout: float = 900.0) -> None:
    end = time.monotonic() + timeout
    while not until():
        if time.monotonic() > end:
            raise TimeoutError(f"the window did not reach the state to photograph: {what}")
        app.processEvents()
        time.sleep(0.05)


def settle(app, window) -> None:
    for _ in range(20):
        app.processEvents()
        time.sleep(0.01)
    window.repaint()
    app.processEvents()


def main(out_dir: Path) -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    sys.path.insert(0, str(ROOT))
    from tests.docs.make_samples import make_text

    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="ellm-reading-"))
    library = work / "Harbour"
    library.mkdir()
    make_text(library / "lock-log-2022.txt", lock_log(2022, 36))     # ~1,200 tokens: read before the window opens
    make_text(library / "lock-log-2023.txt", lock_log(2023, 96))     # ~3,500: the window reads it ahead
    make_text(library / "lock-log-2024.txt", lock_log(2024, 192))    # ~7,000: next in line; then asked about
    make_text(library / "visitors.txt", "Visitor information\n\nThe lighthouse is open on summer weekends.\n"
              "Guided tours leave from the north pier.\n")
    data = work / "data"
    link_model(data / "models")
    ellm = [sys.executable, "-m", "app", "--data-dir", str(data)]
    subprocess.run([*ellm, "ingest", str(library)], check=True)
    subprocess.run([*ellm, "read", "lock-log-2022.txt", "visitors.txt"], check=True)
    subprocess.run([*ellm, "ask", READ_FIRST, "--doc", "lock-log-2022.txt", "--greedy", "--max-tokens", "80"],
                   check=True)

    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication

    from app.session import Session
    from app.settings import Paths, Settings
    from app.ui.library import READ_COLUMN
    from app.ui.main_window import MainWindow
    from app.ui.resources import load_stylesheet

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("eLLM")
    app.setStyleSheet(load_stylesheet())
    session = Session(Paths.resolve(data))
    # Greedy, as `--greedy`: the window's answers are reproducible.
    session.save_settings(Settings(max_tokens=80, temperature=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0))
    window = MainWindow(session, read_ahead=True)
    window.resize(1200, 760)
    window.centralWidget().setSizes([470, 350, 380])   # the library as wide as the viewer and ask pane allow
    window.library.table.horizontalHeader().resizeSection(READ_COLUMN, READ_COLUMN_WIDTH)
    window.show()
    ids = {Path(d["path"]).name: d["id"] for d in session.store.documents()}

    def read(name: str) -> str:
        return next((d.get("read", "") for d in window.library.docs if d["id"] == ids[name]), "")

    def reading(name: str, at_least: int = 0) -> bool:
        state = read(name)
        return (state.startswith("reading ") and state.endswith(" left")
                and int(state.split()[1]) >= at_least)

    window.library.select_id(ids["lock-log-2022.txt"])     # its conversation shows in the ask pane
    wait(app, lambda: reading("lock-log-2023.txt", at_least=20), "lock-log-2023.txt read ahead")
    settle(app, window)
    out_dir.mkdir(parents=True, exist_ok=True)
    window.grab().save(str(out_dir / "reading.png"), "PNG")

    # A question about the document not read yet: answered at once from its best passages; reading
    # ahead yields to it, and afterwards reads that document first.
    window.library.select_id(ids["lock-log-2024.txt"])
    window.ask_pane.question.setText(NOT_READ_YET)
    window.ask_pane.ask_button.click()
    wait(app, lambda: window.ask_job is None, "the answer")
    if window.ask_pane.citations.count():    # the answer's first source, open in the viewer (as a click does)
        window.show_citation(*window.ask_pane.citations.item(0).data(Qt.UserRole))
    wait(app, lambda: reading("lock-log-2024.txt"), "lock-log-2024.txt read after the answer")
    settle(app, window)
    window.grab().save(str(out_dir / "asking.png"), "PNG")
    window.close()
    print(out_dir / "reading.png", out_dir / "asking.png")
    print(f"make_reading.py: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "screenshots"))
