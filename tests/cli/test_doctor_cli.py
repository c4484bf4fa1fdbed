"""`ellm doctor` through the command line."""
from __future__ import annotations


def test_clean_data_dir_is_all_good(cli, corpus):
    cli("ingest", str(corpus))
    rc, out, _ = cli("doctor")
    assert rc == 0 and out.strip().endswith("All good.")


def test_missing_file_is_found_and_marked(cli, corpus):
    cli("ingest", str(corpus))
    (corpus / "notes.txt").unlink()
    rc, report, _ = cli("doctor", "--json", json_out=True)
    assert report["repairs"], report
    _, docs, _ = cli("docs", "--json", json_out=True)
    assert [d["status"] for d in docs if d["path"].endswith("notes.txt")] == ["missing"]


def test_no_repair_changes_nothing(cli, corpus):
    cli("ingest", str(corpus))
    (corpus / "notes.txt").unlink()
    cli("doctor", "--no-repair")
    _, docs, _ = cli("docs", "--json", json_out=True)
    assert [d["status"] for d in docs if d["path"].endswith("notes.txt")] == ["ingested"]
