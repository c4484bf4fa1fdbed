"""The settings dialog: a round trip through the store, restoring defaults, model
metadata, and the KV and attention choices (the KV probe: test_settings_kv.py)."""
from __future__ import annotations

from PySide6.QtCore import Qt

from app.settings import KV_SETTINGS, Settings
from app.engine.attention.config import SparseConfig
from app.engine.kv.formats import BLOCK
from app.qa.doc_cache import KV_SUBDIR
from app.ui.settings_dialog import SPARSE_FIELDS
from tests.ui.conftest import FAST


def open_dialog(qtbot, window):
    dialog = window.open_settings()
    qtbot.addWidget(dialog)
    assert dialog.isVisible()
    model_read(qtbot, dialog)
    return dialog


def model_read(qtbot, dialog):
    """The model's metadata is read in the background; wait for it."""
    qtbot.waitUntil(lambda: not dialog.model_pending, timeout=60_000)


def typed(qtbot, box, text: str) -> None:
    """Replace a spin box's value the way a person does: select all, type, Tab."""
    box.selectAll()
    qtbot.keyClicks(box.lineEdit(), text)
    box.interpretText()


def test_settings_round_trip(qtbot, window, session):
    dialog = open_dialog(qtbot, window)
    assert dialog.engine.currentData() == "llamacpp"
    assert (dialog.n_ctx.value(), dialog.max_tokens.value(), dialog.temperature.value()) == (2048, 40, 0.0)

    dialog.engine.setCurrentIndex(dialog.engine.findData("ellm"))
    typed(qtbot, dialog.n_ctx, "4096")
    typed(qtbot, dialog.max_tokens, "100")
    typed(qtbot, dialog.temperature, "0.7")
    typed(qtbot, dialog.top_k, "20")
    typed(qtbot, dialog.top_p, "0.9")
    typed(qtbot, dialog.repeat_penalty, "1.2")
    typed(qtbot, dialog.threads, "1")
    dialog.numa.setCurrentIndex(dialog.numa.findData("isolate"))
    dialog.kv.setCurrentIndex(dialog.kv.findData("k8v4"))
    dialog.attention.setCurrentIndex(dialog.attention.findData("sparse"))
    with qtbot.waitSignal(dialog.accepted):
        qtbot.mouseClick(dialog.save_button, Qt.LeftButton)
    expected = Settings(engine="ellm", n_ctx=4096, max_tokens=100, temperature=0.7, top_k=20, top_p=0.9,
                        repeat_penalty=1.2, threads=1, numa="isolate", kv="k8v4", attention="sparse")
    assert session.settings == expected
    assert window.statusBar().currentMessage() == "Settings saved; used from the next answer"

    again = open_dialog(qtbot, window)
    assert again.values() == expected
    assert again.engine.currentText() == "eLLM" and again.numa.currentData() == "isolate"
    assert again.n_ctx.value() == 4096 and again.kv.currentData() == "k8v4"
    assert again.attention.currentData() == "sparse"

    qtbot.mouseClick(again.restore_button, Qt.LeftButton)
    assert again.values() == Settings()
    assert again.engine.currentData() == "auto" and again.n_ctx.value() == 0
    assert again.n_ctx.text() == "Automatic (the whole document)"
    assert (again.kv.currentData(), again.attention.currentData()) == ("auto", "auto")
    qtbot.mouseClick(again.save_button, Qt.LeftButton)
    assert session.settings == Settings() and session.store.settings() == {}


def test_cancel_keeps_the_stored_settings(qtbot, window, session):
    dialog = open_dialog(qtbot, window)
    typed(qtbot, dialog.n_ctx, "9999")
    dialog.reject()
    assert session.settings == FAST


def test_an_impossible_combination_is_explained_and_not_saved(qtbot, window, session):
    dialog = open_dialog(qtbot, window)
    typed(qtbot, dialog.max_tokens, "3000")
    qtbot.mouseClick(dialog.save_button, Qt.LeftButton)
    assert dialog.isVisible() and not dialog.error.isHidden()
    assert dialog.error.text() == ("the longest answer (3000 tokens) must be shorter than the context length "
                                   "(2048 tokens)")
    assert session.settings == FAST


def test_model_metadata_and_an_invalid_model_file(qtbot, window, session, tmp_path):
    dialog = open_dialog(qtbot, window)
    info = dialog.model_info.text()
    assert info.lower().startswith("smollm2") and "llama" in info and "Q4_1" in info
    assert "M parameters" in info and "trained context 8,192 tokens" in info and "MiB" in info
    assert dialog.model_info.property("failed") is False

    missing = tmp_path / "gone.gguf"
    dialog.set_model(str(missing))
    assert dialog.model_info.text() == (f"{missing}: no such model file (looked for it as a path and in "
                                        f"{session.paths.models_dir})")
    qtbot.mouseClick(dialog.save_button, Qt.LeftButton)
    assert dialog.isVisible() and dialog.error.text() == dialog.model_info.text()

    bogus = tmp_path / "not-a-model.gguf"
    bogus.write_bytes(b"PK\x03\x04 this is a zip file, not a model" * 10)
    dialog.model.clear()
    qtbot.keyClicks(dialog.model, str(bogus))
    qtbot.keyClick(dialog.model, Qt.Key_Return)
    model_read(qtbot, dialog)
    assert dialog.model_info.text() == f"{bogus}: not a GGUF model file (the first bytes are not 'GGUF')"
    assert dialog.model_info.property("failed") is True
    qtbot.mouseClick(dialog.save_button, Qt.LeftButton)
    assert dialog.isVisible() and dialog.error.text() == dialog.model_info.text()
    assert session.settings == FAST

    qtbot.mouseClick(dialog.default_model_button, Qt.LeftButton)
    assert not dialog.model_pending, "the default model's metadata was read once and remembered"
    assert dialog.model.text() == "" and dialog.model_info.text().lower().startswith("smollm2")


def test_every_kv_format_and_attention_can_be_chosen(qtbot, window):
    dialog = open_dialog(qtbot, window)
    assert [dialog.kv.itemText(i) for i in range(dialog.kv.count())] == list(KV_SETTINGS)
    assert all(dialog.kv.model().item(i).isEnabled() for i in range(dialog.kv.count()))
    assert [dialog.attention.itemData(i) for i in range(dialog.attention.count())] == ["auto", "dense", "sparse",
                                                                                 "sparse-decode"]
    assert dialog.kv_probe_button.isEnabled()


def test_sparse_options_show_the_engine_defaults_read_only(qtbot, window):
    dialog = open_dialog(qtbot, window)
    defaults, answers = SparseConfig(), SparseConfig(mode="sparse-decode")
    # automatic: long documents are answered from the voted blocks (sparse-decode): its options
    assert {name: dialog.sparse[name].value() for _, name, _ in SPARSE_FIELDS} == {
        "block": BLOCK, "sinks": answers.sinks, "window": answers.window, "top_k": answers.k}
    assert all(box.isReadOnly() for box in dialog.sparse.values())
    assert dialog.attention.currentData() == "auto"
    assert all(box.isEnabled() for box in dialog.sparse.values())
    dialog.attention.setCurrentIndex(dialog.attention.findData("dense"))
    assert not any(box.isEnabled() for box in dialog.sparse.values()), "dense attention: they do not apply"
    dialog.attention.setCurrentIndex(dialog.attention.findData("sparse"))
    assert all(box.isEnabled() and box.isReadOnly() for box in dialog.sparse.values())
    assert dialog.sparse["top_k"].value() == defaults.k
    dialog.attention.setCurrentIndex(dialog.attention.findData("sparse-decode"))     # its own K
    assert dialog.sparse["top_k"].value() == answers.k != defaults.k


def test_the_cache_budget_and_reading_ahead_share_round_trip_and_a_smaller_budget_prunes(qtbot, window, session):
    doc = session.store.save_document({"path": "/docs/a.txt", "title": "A", "status": "ingested", "pages": 1},
                                      [(1, 0, "text")], [(1, 0, 4, "text")])
    cache = session.paths.cache_dir / KV_SUBDIR / "a.kv"                # where the data directory keeps caches
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_bytes(b"\0" * 4096)
    session.store.add_kv_cache(doc, "key", str(cache), "model", "f16", 10, 4096)
    dialog = open_dialog(qtbot, window)
    assert dialog.cache_budget.text().startswith("automatic (") and dialog.read_ahead_share.value() == 50
    typed(qtbot, dialog.cache_budget, "0")
    typed(qtbot, dialog.read_ahead_share, "25")
    with qtbot.waitSignal(dialog.accepted):
        qtbot.mouseClick(dialog.save_button, Qt.LeftButton)
    assert (session.settings.cache_budget, session.settings.read_ahead_share) == (0, 0.25)
    assert session.store.kv_caches() == [] and not cache.exists()        # the smaller budget applied at once
    again = open_dialog(qtbot, window)
    assert again.cache_budget.value() == 0.0 and again.read_ahead_share.value() == 25
    typed(qtbot, again.cache_budget, "2.5")
    assert again.values().cache_budget == int(2.5 * (1 << 30))
