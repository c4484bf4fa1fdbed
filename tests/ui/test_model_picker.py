"""The model picker of the settings dialog: the catalogue with what each model needs and how fast
it would decode here, installing in the background with progress, and using what is installed."""
from __future__ import annotations

from PySide6.QtCore import Qt

import app.runtime.catalog as catalog
import app.ui.model_picker
from app.ui.model_picker import COLUMNS, SPEED_COLUMN, STATE_COLUMN, predicted_speed
from tests.runtime.test_catalog import index  # noqa: F401  (the local package index fixture)


def test_the_picker_shows_the_catalogue_and_predicts_speed_from_the_kernels_stream(qtbot, window):
    dialog = window.open_settings()
    qtbot.addWidget(dialog)
    picker = dialog.open_catalog()
    assert picker.table.rowCount() == len(catalog.CATALOG) and picker.table.columnCount() == len(COLUMNS)
    first = catalog.CATALOG[0]
    assert picker.table.item(0, 0).text() == first.title + " (default)"
    assert picker.table.item(0, STATE_COLUMN).text() == "not installed"
    qtbot.waitUntil(lambda: picker.stream_gb_s is not None, timeout=60_000)
    expected = picker.stream_gb_s * 1e9 / first.weight_bytes_per_token
    assert picker.table.item(0, SPEED_COLUMN).text() == f"up to ≈{expected:.0f} tokens/s"
    assert predicted_speed(first, None) == "measuring…"
    assert picker.install_button.isEnabled() and not picker.use_button.isEnabled()


def test_install_in_the_background_then_use_the_model(qtbot, window, session, index, monkeypatch):  # noqa: F811
    monkeypatch.setattr(app.ui.model_picker, "_probe_stream", lambda ctl: 30.0)   # not this test's subject
    wheels, model, data = index
    dialog = window.open_settings()
    qtbot.addWidget(dialog)
    picker = dialog.open_catalog()
    picker.table.selectRow(0)
    qtbot.mouseClick(picker.install_button, Qt.LeftButton)
    assert picker.install_button.text() == "Cancel install" and picker.progress.isVisible()
    qtbot.waitUntil(lambda: picker.install_job is None, timeout=60_000)
    installed = session.paths.models_dir / model.file
    assert installed.read_bytes() == data and picker.status.text() == f"Installed {installed}"
    assert picker.table.item(0, STATE_COLUMN).text() == "installed" and picker.use_button.isEnabled()
    qtbot.mouseClick(picker.use_button, Qt.LeftButton)
    assert dialog.model.text() == str(installed) and not picker.isVisible()
