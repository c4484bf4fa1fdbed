"""ProgressLine: long work's progress on stderr, readable in a log (not a line per chunk)."""
from __future__ import annotations

from app.cli.context import ProgressLine


def test_a_log_gets_the_start_a_line_every_few_seconds_and_the_end(capsys):
    clock = iter([0.0, 0.0, 1.0, 2.0, 6.0, 7.0, 8.0])
    line = ProgressLine("read", every=5.0, clock=lambda: next(clock))
    for done in (0, 0, 256, 512, 768, 1024, 1280):
        line(done, 1280, f"reading Manual: {done:,} of 1,280 tokens")
    said = capsys.readouterr().err.splitlines()
    assert said == ["read: reading Manual: 0 of 1,280 tokens",      # once, though reported twice
                    "read: reading Manual: 768 of 1,280 tokens",    # 6 s after the last line
                    "read: reading Manual: 1,280 of 1,280 tokens"]  # the end
