"""Time left of long work (ingesting a folder, reading a document), said as a person reads it,
from the rate so far."""
from __future__ import annotations


def duration(seconds: float) -> str:
    """"3 s", "12 min", "1.5 h"."""
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    if seconds < 3600:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def time_left(elapsed: float, done: float, total: float) -> float | None:
    """Seconds left when ``done`` of ``total`` units took ``elapsed`` seconds (None: no rate yet)."""
    if done <= 0 or elapsed <= 0:
        return None
    return elapsed * max(0.0, total - done) / done


__all__ = ["duration", "time_left"]
