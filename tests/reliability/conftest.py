"""A test that fails half-way must not leave an `ellm` it started running (one may be
paused inside a transaction on purpose)."""
from __future__ import annotations

import pytest

from tests.reliability.helpers import STARTED


@pytest.fixture(autouse=True)
def no_leftover_processes():
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
