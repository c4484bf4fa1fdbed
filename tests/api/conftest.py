"""An API server over a fake backend (tests/qa/fake_backend.py), in this process: the protocol,
the conversations, the queue and the key rules in seconds, without a model."""
from __future__ import annotations

import threading
import time

import pytest

from app.api.server import ApiServer
from app.session import Session
from app.settings import Paths, Settings
from tests.qa.fake_backend import FakeBackend
from tests.qa.test_answer_service import PAGES, add_document

ANSWER = "Three green lamps above the pier [p. 3]."


class SlowBackend(FakeBackend):
    """The fake backend, ``delay`` seconds a token; records how many generations ran at once and
    whether one was cancelled."""

    def __init__(self, *a, delay: float = 0.0, **kw):
        super().__init__(*a, **kw)
        self.delay, self.running, self.most_at_once, self.cancelled, self.finished = delay, 0, 0, 0, 0
        self.lock = threading.Lock()

    def generate(self, prompt, params, cancel=None):
        tokens = super().generate(prompt, params, cancel)

        def slow():
            with self.lock:
                self.running += 1
                self.most_at_once = max(self.most_at_once, self.running)
            try:
                for t in tokens:
                    time.sleep(self.delay)
                    yield t
                if cancel is not None and cancel():
                    self.cancelled += 1
                else:
                    self.finished += 1
            finally:
                with self.lock:
                    self.running -= 1
        return slow()


@pytest.fixture
def api_session(tmp_path):
    """A session with one document ('Harbour Log', log.txt) and a fake model 'fake.gguf'."""
    paths = Paths.resolve(tmp_path / "data")
    model = paths.ensure().models_dir / "fake.gguf"
    model.parent.mkdir(parents=True, exist_ok=True)
    model.write_bytes(b"GGUF fake model bytes")
    session = Session(paths)
    session.save_settings(Settings(model=str(model)))
    add_document(session.store, str(tmp_path / "log.txt"), "Harbour Log", PAGES)
    backend = SlowBackend(model, n_ctx=4096, answer=ANSWER, composes=True)
    session.backend = lambda doc_tokens=None: backend
    session.doc_tokens = lambda ids: 200
    session.fake = backend
    return session


@pytest.fixture
def server(api_session):
    s = ApiServer(api_session, "127.0.0.1", 0)
    s.start()
    yield s
    s.stop()
