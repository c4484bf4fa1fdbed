"""A batch's results as a file: CSV, JSON Lines or Markdown, chosen by the file's suffix.

Every format holds the same rows, one per document and task, with the keys of ``ROW_KEYS``
(README, "ellm batch"); each citation names its document and page and the passage.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".md": "md"}
ROW_KEYS = ("batch", "doc", "title", "path", "kind", "question", "answer", "citations", "model", "engine",
            "settings", "worker", "created_at")


class BatchExportError(Exception):
    pass


def format_for(path: str | Path) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise BatchExportError(f"{path}: the results file must end in .csv, .jsonl or .md, not "
                               f"'{suffix or 'no suffix'}'")
    return FORMATS[suffix]


def export_rows(results: list[dict]) -> list[dict]:
    """Store rows (app/store/batches.results) as the exported rows."""
    return [{"batch": r["batch_id"], "doc": r["doc_id"], "title": r.get("title") or "", "path": r.get("path") or "",
             "kind": r["kind"], "question": r["question"], "answer": r["answer"],
             "citations": [{"doc": c["doc"], "page": c["page"], "text": c.get("text", "")} for c in r["citations"]],
             "model": r["model"], "engine": r.get("engine") or "", "settings": r["settings"],
             "worker": r.get("worker") or "", "created_at": r["created_at"]} for r in results]


def write_results(path: str | Path, rows: list[dict]) -> Path:
    """Write ``rows`` (``export_rows``) to ``path`` in its suffix's format, through a temporary
    file renamed into place: an interrupted export leaves the previous file whole."""
    path = Path(path).expanduser()
    fmt = format_for(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        if fmt == "csv":
            writer = csv.DictWriter(f, fieldnames=[*ROW_KEYS, "pages"])
            writer.writeheader()
            for r in rows:
                writer.writerow({**r, "citations": json.dumps(r["citations"], ensure_ascii=False),
                                 "pages": "; ".join(f"{c['doc']}:{c['page']}" for c in r["citations"])})
        elif fmt == "jsonl":
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        else:
            f.write(markdown(rows))
    tmp.replace(path)
    return path


def markdown(rows: list[dict]) -> str:
    if not rows:
        return "# Batch results\n\nNo results yet.\n"
    out = [f"# Batch {rows[0]['batch']}", "", f"Model {rows[0]['model']}, {len(rows)} answers.", ""]
    current = None
    for r in rows:
        if r["doc"] != current:
            current = r["doc"]
            out += [f"## {r['title'] or r['path']} (document {r['doc']})", ""]
        out += [f"### {r['question'] if r['kind'] == 'ask' else 'Summary'}", "", r["answer"].strip() or "(empty)", ""]
        if r["citations"]:
            out.append("Sources:")
            for c in r["citations"]:
                passage = " ".join(c["text"].split())[:200]
                out.append(f"- p. {c['page']}" + (f': "{passage}"' if passage else ""))
            out.append("")
    return "\n".join(out)
