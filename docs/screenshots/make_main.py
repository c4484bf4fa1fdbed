"""Make docs/screenshots/main.png: the main window as `ellm gui --screenshot` renders it, on a
small library with a real multi-page PDF report that is read (its KV cache on disk), and a
conversation about it: a question and a follow-up, the viewer on the page the answer cites.

    QT_QPA_PLATFORM=offscreen .venv/bin/python docs/screenshots/make_main.py [OUT.png]

The model is Qwen2.5-Coder-1.5B-Instruct, the app's default model: the script links the first
of $ELLM_SCREENSHOT_MODEL, ~/.cache/ellm-models/qwen15.gguf into a fresh data directory's models
folder under the catalogue's file name, where `ellm` finds the default model once installed
(`ellm models install qwen2.5-coder-1.5b-instruct` installs it). The report is read into its
cache with the automatic settings (eLLM's engine), as reading ahead does; the questions are
answered through llama.cpp, greedy, so the answers are reproducible (and cite the right page).
Three to five minutes on two cores, more when eLLM's kernels are compiled first (after the engine's
sources changed).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pymupdf

ROOT = Path(__file__).resolve().parents[2]
MODEL_FILE = "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf"   # the catalogue's name (app/runtime/catalog.py)
MODEL_CANDIDATES = [os.environ.get("ELLM_SCREENSHOT_MODEL", ""), "~/.cache/ellm-models/qwen15.gguf"]
REPORT_FILE = "annual-report-2024.pdf"
EARLIER = "What are the Authority's plans for 2025?"       # an older conversation about the report
QUESTION = "How much did the new lock gates cost?"
FOLLOW_UP = "When did the lock reopen?"                     # the conversation's second turn

# One section per page, so that the answers cite pages that differ (A5, like a printed report).
PAGES = [
    """<h1>Riverside Harbour Authority</h1>
<h2>Annual Report 2024</h2>
<p>This report describes the work of the Riverside Harbour Authority in 2024: traffic on the river,
the renewal of the east lock, the finances of the Authority and its plans for 2025.</p>
<h3>1. Traffic on the river</h3>
<p>In 2024, 4,812 barges passed through the harbour, 6 percent more than in 2023. Grain and timber
remained the largest cargoes. Passenger boats made 1,250 trips between April and October.</p>
<p>The busiest month was September, when the harvest brought 610 barges to the grain quay.</p>""",
    """<h3>2. The east lock</h3>
<p>The east lock was built in 1898 and its wooden gates had reached the end of their life. In
January 2024 the lock was closed and drained, and the old gates were removed.</p>
<p>The new steel lock gates cost 2.4 million euros. They were made in Rotterdam, floated up the river
in March, and fitted in April. The east lock reopened to traffic on 14 May 2024, two weeks ahead of
plan. The new gates open in four minutes instead of eleven.</p>
<p>During the works, barges used the west lock, which was kept open day and night; waiting times
rose to two hours in February.</p>""",
    """<h3>3. Finances</h3>
<p>Tolls brought in 5.1 million euros and mooring fees 0.9 million euros. Running costs were
3.2 million euros. The lock gates were paid from the renewal fund, which now holds 1.3 million
euros.</p>
<h3>4. Plans for 2025</h3>
<p>In 2025 the Authority will dredge the grain quay, replace the lighting on the north pier and
begin a study of a second lock for larger barges. The keeper's cottage at the lighthouse will be
restored and opened to visitors in the summer.</p>
<p>The board thanks the lock keepers, the pilots and the people of Riverside for their patience
during the works.</p>""",
]
CSS = "h1 {font-size: 20pt;} h2 {font-size: 15pt; color: #444;} h3 {font-size: 13pt;} p {font-size: 11pt;}"


def make_report(path: Path) -> None:
    writer = pymupdf.DocumentWriter(str(path))
    page = pymupdf.paper_rect("a5")
    for html in PAGES:
        story = pymupdf.Story(html=html, user_css=CSS)
        more = True
        while more:
            device = writer.begin_page(page)
            more, _ = story.place(page + (40, 40, -40, -40))
            story.draw(device)
            writer.end_page()
    writer.close()
    with pymupdf.open(path) as doc:  # the title a reader sees in the library
        doc.set_metadata({"title": "Harbour Authority Annual Report 2024", "author": "Riverside Harbour Authority"})
        doc.saveIncr()


def link_model(models: Path) -> None:
    """The 1.5B model in the data directory's models folder, where `ellm` takes it as the default."""
    for candidate in MODEL_CANDIDATES:
        source = Path(candidate).expanduser() if candidate else None
        if source is not None and source.is_file():
            models.mkdir(parents=True, exist_ok=True)
            (models / MODEL_FILE).symlink_to(source.resolve())
            return
    sys.exit(f"make_main.py: no {MODEL_FILE}: set ELLM_SCREENSHOT_MODEL to its path "
             "(or `ellm models install qwen2.5-coder-1.5b-instruct` and link it to ~/.cache/ellm-models/qwen15.gguf)")


def main(out: str) -> int:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from tests.docs.make_samples import make_html, make_text, make_truncated_pdf

    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="ellm-shot-"))
    library = work / "Harbour"
    library.mkdir()
    make_report(library / REPORT_FILE)
    make_text(library / "board-minutes.md", "# Board minutes, 3 June 2024\n\nThe board approved the lighthouse "
              "restoration.\n\n## Lock gates\n\nThe final invoice for the gates was paid.\n")
    make_html(library / "visitors.html", ["The lighthouse is open on summer weekends.",
                                          "Guided tours leave from the north pier."], title="Visitor information")
    make_truncated_pdf(library / "scan-2019.pdf")
    data = work / "data"
    link_model(data / "models")
    ellm = [sys.executable, "-m", "app", "--data-dir", str(data)]
    ask = ["--doc", REPORT_FILE, "--engine", "llamacpp", "--greedy", "--max-tokens", "120", "--ctx", "4096"]
    subprocess.run([*ellm, "ingest", str(library)], check=True)
    subprocess.run([*ellm, "read", REPORT_FILE], check=True)     # the automatic settings, as reading ahead
    subprocess.run([*ellm, "ask", EARLIER, *ask], check=True)
    subprocess.run([*ellm, "ask", QUESTION, *ask], check=True)
    threads = json.loads(subprocess.run([*ellm, "--json", "threads"], check=True, capture_output=True, text=True).stdout)
    thread_id = next(t["id"] for t in threads if t["title"] == QUESTION)
    subprocess.run([*ellm, "ask", FOLLOW_UP, "--thread", str(thread_id), *ask[2:]], check=True)
    code = subprocess.run([*ellm, "gui", "--screenshot", out]).returncode
    print(f"make_main.py: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "docs" / "screenshots" / "main.png")))
