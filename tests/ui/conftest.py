"""Fixtures for the window tests: a data directory set up for fast, deterministic
answers (llama.cpp, 2048-token context, greedy, short answers) and the window on it.
Shared steps (ingest, ask) are in helpers.py."""
from __future__ import annotations

import pytest

from app.settings import Paths, Settings
from app.session import Session
from app.ui.main_window import MainWindow

FAST = Settings(engine="llamacpp", n_ctx=2048, max_tokens=40, temperature=0.0)


@pytest.fixture
def session(data_dir):
    s = Session(Paths.resolve(data_dir))
    s.save_settings(FAST)
    return s


@pytest.fixture
def window(qtbot, session):
    w = MainWindow(session)
    qtbot.addWidget(w)
    w.show()
    return w

