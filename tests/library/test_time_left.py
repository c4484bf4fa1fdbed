"""The time long work has left, from its rate so far (app/library/time_left.py)."""
from __future__ import annotations

from app.library.time_left import duration, time_left


def test_the_time_left_follows_the_rate_so_far_and_reads_as_a_person_says_it():
    assert time_left(elapsed=10.0, done=250, total=1000) == 30.0
    assert time_left(elapsed=0.0, done=0, total=1000) is None          # no rate yet
    assert time_left(elapsed=5.0, done=1000, total=1000) == 0.0
    assert [duration(s) for s in (0.2, 42.4, 90, 3599, 5400)] == ["1 s", "42 s", "2 min", "60 min", "1.5 h"]
