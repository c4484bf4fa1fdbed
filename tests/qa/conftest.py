"""Fixtures of the answer-service tests: a fresh store and a stand-in model file (the fake
backend never reads it; the document caches fingerprint it)."""
from __future__ import annotations

import pytest

from app.store import Store


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "ellm.db")
    yield s
    s.close()


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"GGUF fake model bytes")
    return path
