"""The hardware panel: what this machine can do for decoding, live speed, and the thread plan.

It shows a report from ``app.hardware.hardware_report`` and holds no logic of its own: when a
person changes threads or NUMA policy it emits ``sig_threads_changed``; the window makes a new
report (``hardware_report(threads=..., numa_policy=..., probe_bandwidth=False)``) and hands it
back with ``set_report``.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox, QFormLayout, QHBoxLayout, QLabel, QPushButton, QSpinBox, QVBoxLayout, QWidget,
)

from app.settings import NUMA_POLICIES
from app.runtime.hw_report import format_cpulist

NUMA_TIPS = {
    "distribute": "Threads on every NUMA node; weights and KV cache split so each node reads its own memory",
    "isolate": "Threads and memory on one node (the one with the most free memory)",
    "none": "No NUMA placement: threads in CPU order, memory wherever it lands",
}
WARNING_STYLE = "color: #b00020; font-weight: 600;"
GiB = 1 << 30


class HardwarePanel(QWidget):
    """CPU, cores, NUMA nodes, governor, bandwidth, thread plan, KV budget and warnings."""

    sig_threads_changed = Signal(int, str)
    """(threads, numa_policy) — the person applied another thread plan; 0 threads = one per physical core."""

    def __init__(self, report: dict, parent=None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        heading = QLabel("Hardware")
        heading.setObjectName("heading")
        layout.addWidget(heading)

        form = QFormLayout()
        self.cpu = QLabel()
        self.cores = QLabel()
        self.memory = QLabel()
        self.nodes = QLabel()
        self.governor = QLabel()
        self.bandwidth = QLabel()
        self.stream = QLabel()
        self.stream.setToolTip("How fast the engine's weight products get through a Q4_K_M model's bytes for one "
                               "token, measured: a ceiling of decode speed (bytes a token reads), reached to ~80 %")
        self.plan = QLabel()
        self.kv = QLabel()
        for label, widget in (("CPU", self.cpu), ("Cores", self.cores), ("Memory", self.memory),
                              ("NUMA nodes", self.nodes), ("Governor", self.governor),
                              ("Read bandwidth", self.bandwidth), ("Weight streaming", self.stream),
                              ("Thread plan", self.plan),
                              ("KV cache", self.kv)):
            widget.setWordWrap(True)
            form.addRow(label, widget)
        layout.addLayout(form)

        self.live = QLabel()
        self.live.setObjectName("stats")
        layout.addWidget(self.live)

        controls = QHBoxLayout()
        controls.addWidget(QLabel("Threads"))
        self.threads = QSpinBox()
        self.threads.setSpecialValueText("auto (one per core)")
        self.threads.setToolTip("0 = one thread per physical core, never two on SMT siblings")
        controls.addWidget(self.threads)
        controls.addWidget(QLabel("NUMA"))
        self.policy = QComboBox()
        for i, name in enumerate(NUMA_POLICIES):
            self.policy.addItem(name)
            self.policy.setItemData(i, NUMA_TIPS[name], Qt.ItemDataRole.ToolTipRole)
        controls.addWidget(self.policy)
        self.apply_button = QPushButton("Apply")
        self.apply_button.clicked.connect(self._apply)
        controls.addWidget(self.apply_button)
        controls.addStretch(1)
        layout.addLayout(controls)

        self.warnings = QLabel()
        self.warnings.setObjectName("warnings")
        self.warnings.setWordWrap(True)
        self.warnings.setStyleSheet(WARNING_STYLE)
        layout.addWidget(self.warnings)
        layout.addStretch(1)

        self.report: dict = {}
        self.set_report(report)
        self.set_live(None, None)

    # ---- Public API ------------------------------------------------------------

    def set_report(self, report: dict) -> None:
        """Show a (new) report; the controls take its thread count and policy."""
        self.report = report
        self.cpu.setText(report["cpu_model"])
        self.cores.setText(
            f"{report['physical_cores']} physical, {report['logical_cores']} logical, "
            f"{report['sockets']} socket{'s' if report['sockets'] != 1 else ''}"
            + (" (SMT)" if report.get("smt") else ""))
        self.memory.setText(f"{report['mem_available_bytes'] / GiB:.1f} GiB free of "
                            f"{report['mem_total_bytes'] / GiB:.1f} GiB")
        self.nodes.setText("\n".join(
            f"node {n['id']}: CPUs {format_cpulist(n['cpus'])}, {n['mem_bytes'] / GiB:.1f} GiB"
            for n in report["numa_nodes"]))
        self.governor.setText(report["governor"] or "unknown (no cpufreq)")
        gb_s = report.get("bandwidth_gb_s")
        self.bandwidth.setText(f"{gb_s:.1f} GB/s" if gb_s is not None else "not measured")
        stream = report.get("weight_stream_gb_s")
        threads = (report.get("weight_stream") or {}).get("threads")
        self.stream.setText(f"{stream:.1f} GB/s through the weight kernels ({threads} threads)"
                            if stream is not None else "not measured")
        self.plan.setText(report["threads"]["plan"])
        kv = report["kv"]
        if kv.get("bytes_per_token") is None:
            self.kv.setText("no model chosen")
        else:
            self.kv.setText(f"{kv['bytes_per_token']:,} bytes/token ({kv['setting']}); "
                            f"fits {kv['max_context']:,} tokens in free RAM; "
                            f"recommended context {kv['recommended_context']:,}")
        warnings = report.get("warnings") or []
        self.warnings.setText("\n".join(f"⚠ {w}" for w in warnings))
        self.warnings.setVisible(bool(warnings))

        self.threads.setRange(0, max(1, report["logical_cores"]))
        self.threads.setValue(report["threads"].get("requested", 0))
        self.policy.setCurrentText(report["threads"]["numa_policy"])

    def set_live(self, tok_s: float | None, gb_s: float | None) -> None:
        """Live decode speed while an answer is generated; None, None when idle."""
        if tok_s is None:
            self.live.setText("Live: idle")
            return
        line = f"Live: {tok_s:.1f} tok/s"
        if gb_s is not None:
            line += f", {gb_s:.2f} GB/s"
            peak = self.report.get("bandwidth_gb_s")
            if peak:
                line += f" ({100 * gb_s / peak:.0f}% of the measured {peak:.1f} GB/s)"
        self.live.setText(line)

    # ---- Internals -------------------------------------------------------------

    def _apply(self) -> None:
        self.sig_threads_changed.emit(self.threads.value(), self.policy.currentText())
