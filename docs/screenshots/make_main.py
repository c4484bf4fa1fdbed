"""Make docs/screenshots/main.png: a small library with a real multi-page PDF report,
one question asked about it, and the window rendered offscreen.

    QT_QPA_PLATFORM=offscreen .venv/bin/python docs/screenshots/make_main.py [OUT.png]

Uses llama.cpp with the default model, greedy, so the answer is reproducible.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pymupdf

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "How much did the new lock gates cost?"

REPORT = """
<h1>Riverside Harbour Authority</h1>
<h2>Annual Report 2024</h2>
<p>This report describes the work of the Riverside Harbour Authority in 2024: traffic on the river,
the renewal of the east lock, the finances of the Authority and its plans for 2025.</p>
<h3>1. Traffic on the river</h3>
<p>In 2024, 4,812 barges passed through the harbour, 6 percent more than in 2023. Grain and timber
remained the largest cargoes. Passenger boats made 1,250 trips between April and October.</p>
<p>The busiest month was September, when the harvest brought 610 barges to the grain quay.</p>
<h3>2. The east lock</h3>
<p>The east lock was built in 1898 and its wooden gates had reached the end of their life. In
January 2024 the lock was closed and drained, and the old gates were removed.</p>
<p>The new steel lock gates cost 2.4 million euros. They were made in Rotterdam, floated up the river
in March, and fitted in April. The east lock reopened to traffic on 14 May 2024, two weeks ahead of
plan. The new gates open in four minutes instead of eleven.</p>
<h3>3. Finances</h3>
<p>Tolls brought in 5.1 million euros and mooring fees 0.9 million euros. Running costs were
3.2 million euros. The lock gates were paid from the renewal fund, which now holds 1.3 million
euros.</p>
<h3>4. Plans for 2025</h3>
<p>In 2025 the Authority will dredge the grain quay, replace the lighting on the north pier and
begin a study of a second lock for larger barges. The keeper's cottage at the lighthouse will be
restored and opened to visitors in the summer.</p>
<p>The board thanks the lock keepers, the pilots and the people of Riverside for their patience
during the works.</p>
"""
CSS = "h1 {font-size: 20pt;} h2 {font-size: 15pt; color: #444;} h3 {font-size: 13pt;} p {font-size: 11pt;}"


def make_report(path: Path) -> None:
    story = pymupdf.Story(html=REPORT, user_css=CSS)
    writer = pymupdf.DocumentWriter(str(path))
    page = pymupdf.paper_rect("a5")
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


def main(out: str) -> int:
    sys.path.insert(0, str(ROOT))
    from tests.docs.make_samples import make_html, make_text, make_truncated_pdf

    work = Path(tempfile.mkdtemp(prefix="ellm-shot-"))
    library = work / "Harbour"
    library.mkdir()
    make_report(library / "annual-report-2024.pdf")
    make_text(library / "board-minutes.md", "# Board minutes, 3 June 2024\n\nThe board approved the lighthouse "
              "restoration.\n\n## Lock gates\n\nThe final invoice for the gates was paid.\n")
    make_html(library / "visitors.html", ["The lighthouse is open on summer weekends.",
                                          "Guided tours leave from the north pier."], title="Visitor information")
    make_truncated_pdf(library / "scan-2019.pdf")
    ellm = [sys.executable, "-m", "app", "--data-dir", str(work / "data")]
    subprocess.run([*ellm, "ingest", str(library)], check=True)
    subprocess.run([*ellm, "ask", QUESTION, "--doc", "annual-report-2024.pdf", "--engine", "llamacpp",
                    "--greedy", "--max-tokens", "120", "--ctx", "4096"], check=True)
    return subprocess.run([*ellm, "gui", "--screenshot", out]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "docs" / "screenshots" / "main.png")))
