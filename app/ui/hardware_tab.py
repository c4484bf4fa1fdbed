"""The hardware tab: the hardware panel (app/ui/hardware_panel.py) fed with
``app.runtime.hw_report.hardware_report``, made in the background the first time the tab is
shown (reading the topology and probing bandwidth take seconds)."""
from __future__ import annotations

from PySide6.QtCore import Qt, QThreadPool, Signal
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app.runtime.hw_report import hardware_report
from app.ui.hardware_panel import HardwarePanel
from app.ui.workers import Job, JobControl, start


class HardwareTab(QWidget):
    sig_error = Signal(str)
    """The report could not be made; the message says why."""
    sig_message = Signal(str)
    """A change was applied (for the status bar)."""

    def __init__(self, session, pool: QThreadPool | None = None, parent=None):
        super().__init__(parent)
        self.session = session
        self.pool = pool or QThreadPool.globalInstance()
        self.panel = None  # the HardwarePanel once the first report is in
        self.job: Job | None = None
        self.report: dict | None = None
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self.placeholder = QLabel("")
        self.placeholder.setObjectName("placeholder")
        self.placeholder.setAlignment(Qt.AlignCenter)
        self.placeholder.setWordWrap(True)
        self._layout.addWidget(self.placeholder)
        self.placeholder.setText("Looking at this machine…")

    # ---- Public API --------------------------------------------------------

    def ensure_loaded(self, probe_bandwidth: bool = True) -> Job | None:
        """Start making the report unless it exists or is on its way."""
        if self.report is not None or self.job is not None:
            return self.job
        return self._refresh(probe_bandwidth)

    def set_live(self, tok_s: float | None, gb_s: float | None) -> None:
        if self.panel is not None:
            self.panel.set_live(tok_s, gb_s)

    # ---- Internals -------------------------------------------------------------

    def _refresh(self, probe_bandwidth: bool) -> Job:
        session = self.session
        previous = self.report

        def work(ctl: JobControl) -> dict:
            s = session.settings
            try:
                model = session.model_path
            except Exception:  # no usable model: the report still describes the machine
                model = None
            tokens = [d["tokens"] for d in session.store.documents() if d["status"] == "ingested"]
            kv = s.kv
            if kv == "auto":
                kv = session.plan().kv if model is not None else "f16"
            report = hardware_report(model_path=model, kv=kv, doc_tokens=tokens,
                                     threads=s.threads, numa_policy=s.numa, probe_bandwidth=probe_bandwidth,
                                     context=s.n_ctx or None)
            if not probe_bandwidth and previous and previous.get("bandwidth_gb_s") is not None:
                report["bandwidth_gb_s"] = previous["bandwidth_gb_s"]  # measured once is enough
                report["bandwidth"] = previous.get("bandwidth")
                report["weight_stream_gb_s"] = previous.get("weight_stream_gb_s")   # on the threads it says
                report["weight_stream"] = previous.get("weight_stream")
            return report

        job = Job(work)
        job.signals.sig_done.connect(self._show)
        job.signals.sig_error.connect(self._failed)
        job.signals.sig_finished.connect(self._finished)
        self.job = start(job, self.pool)
        return job

    def _show(self, report: dict) -> None:
        self.report = report
        if self.panel is None:
            self.panel = HardwarePanel(report)
            self.panel.sig_threads_changed.connect(self._apply_threads)
            self._layout.removeWidget(self.placeholder)
            self.placeholder.hide()
            self._layout.addWidget(self.panel)
        else:
            self.panel.set_report(report)

    def _apply_threads(self, threads: int, numa: str) -> None:
        try:
            self.session.save_settings(self.session.settings.with_(threads=threads, numa=numa))
        except Exception as e:
            self.sig_error.emit(f"cannot save the thread settings ({e})")
            return
        self.sig_message.emit(f"Threads: {threads or 'one per physical core'}, NUMA policy {numa}; "
                              "used from the next answer")
        if self.job is None:
            self._refresh(probe_bandwidth=False)

    def _failed(self, message: str) -> None:
        self.placeholder.setText(f"Cannot describe this machine: {message}")
        self.sig_error.emit(f"Hardware report: {message}")

    def _finished(self) -> None:
        self.job = None
