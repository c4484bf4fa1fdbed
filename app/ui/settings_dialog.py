"""The settings dialog: model, engine, context, KV precision, sparse attention,
sampling, threads and NUMA policy. It edits an ``app.config.Settings`` and saves
it through the session; the defaults are Settings' own (one table)."""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFileDialog, QFormLayout, QGroupBox, QHBoxLayout,
    QLineEdit, QPushButton, QSpinBox, QVBoxLayout,
)

from app.config import ENGINES, NUMA_POLICIES, Settings
from app.ui.workers import Job, start
from app.ui.widgets import info_label

ENGINE_LABELS = {"auto": "Automatic (eLLM when it runs the model)", "ellm": "eLLM", "llamacpp": "llama.cpp"}
KV_PRECISIONS = ("f16", "k8v8", "k8v4", "k4v4")
KV_TIPS = {"f16": "16-bit keys and values (exact)", "k8v8": "8-bit keys and values",
           "k8v4": "8-bit keys, 4-bit values (the usual trade: keys are more sensitive)",
           "k4v4": "4-bit keys and values (smallest)"}
KV_LATER = "arrives with the quantized KV cache"
KV_NOW = ("Sizes the KV cache in the hardware tab and `ellm hw`; answers use f16 until the quantized "
          "KV cache arrives")
# (Settings field, label, minimum, maximum, shown default, tooltip) of sparse retrieval attention
SPARSE_FIELDS = (
    ("sparse_block", "Block size (tokens)", 16, 1024, 64, "B: tokens per KV block"),
    ("sparse_sinks", "Sink tokens", 0, 4096, 64, "S: the first tokens every query attends to"),
    ("sparse_window", "Local window (tokens)", 0, 65536, 1024, "W: the most recent tokens every query attends to"),
    ("sparse_top_k", "Retrieved blocks", 0, 4096, 16, "K: blocks chosen per query by their representatives"),
)
SPARSE_LATER = "arrives with sparse retrieval attention"
KV_PROBE_LATER = "arrives with `ellm kv-probe`: it measures how much each KV precision changes the answers"
NUMA_LABELS = {"distribute": "distribute (use every node)", "isolate": "isolate (one node)", "none": "none"}
GiB = 1 << 30


def settings_fields() -> set[str]:
    return {f.name for f in fields(Settings)}


def describe_model(path: str) -> tuple[str, bool]:
    """A readable line of a GGUF file's metadata, or the reason it cannot be used (ok=False).
    Takes seconds on a big vocabulary (gguf parses every field), so the dialog calls it
    in the background and remembers the answer per file version."""
    from app.models import ModelError, default_model_path, read_model_info

    try:
        info = read_model_info(path or default_model_path())
    except ModelError as e:
        return str(e), False
    size = f"{info.file_size / GiB:.2f} GiB" if info.file_size >= GiB else f"{info.file_size / 2**20:.0f} MiB"
    return (f"{info.name}: {info.architecture}, {info.parameters / 1e6:,.0f}M parameters, {info.quantization}, "
            f"trained context {info.context_length:,} tokens, {size}"), True


_described: dict[tuple, tuple[str, bool]] = {}  # (path, mtime, size) -> describe_model's answer


def _version(path: str) -> tuple | None:
    """What identifies one version of the model file ("" = the default model)."""
    from app.models import ModelError, default_model_path

    try:
        p = Path(path).expanduser() if path else default_model_path()
        st = p.stat()
    except (ModelError, OSError):
        return None
    return str(p), st.st_mtime, st.st_size


class SettingsDialog(QDialog):
    def __init__(self, session, parent=None):
        super().__init__(parent)
        self.session = session
        self.setWindowTitle("eLLM settings")
        self.setObjectName("settings")
        self.setMinimumWidth(560)
        known = settings_fields()
        layout = QVBoxLayout(self)

        model_box = QGroupBox("Model")
        form = QFormLayout(model_box)
        row = QHBoxLayout()
        self.model = QLineEdit()
        self.model.setObjectName("modelPath")
        self.model.setPlaceholderText("the default model (SmolLM2-135M-Instruct)")
        self.model.editingFinished.connect(self._model_changed)
        self.choose_model_button = QPushButton("Choose…")
        self.choose_model_button.clicked.connect(self.choose_model)
        self.default_model_button = QPushButton("Default")
        self.default_model_button.setToolTip("Use the default model")
        self.default_model_button.clicked.connect(lambda: self.set_model(""))
        row.addWidget(self.model, 1)
        row.addWidget(self.choose_model_button)
        row.addWidget(self.default_model_button)
        form.addRow("GGUF file", row)
        self.model_info = info_label("", "modelInfo")
        form.addRow("", self.model_info)
        self.engine = QComboBox()
        for e in ENGINES:
            self.engine.addItem(ENGINE_LABELS[e], e)
        form.addRow("Engine", self.engine)
        self.n_ctx = QSpinBox()
        self.n_ctx.setRange(256, 1 << 20)
        self.n_ctx.setSingleStep(1024)
        self.n_ctx.setSuffix(" tokens")
        self.n_ctx.setToolTip("Prompt and answer together; a longer document is reduced to its most relevant pages")
        form.addRow("Context length", self.n_ctx)
        layout.addWidget(model_box)

        attention = QGroupBox("KV cache and attention")
        form = QFormLayout(attention)
        self.kv = QComboBox()
        self.kv_setting = "kv" in known
        for i, name in enumerate(KV_PRECISIONS):
            self.kv.addItem(name, name)
            usable = self.kv_setting or name == "f16"
            self.kv.model().item(i).setEnabled(usable)
            self.kv.setItemData(i, KV_TIPS[name] if usable else f"{KV_TIPS[name]}: {KV_LATER}", Qt.ToolTipRole)
        self.kv.setToolTip(KV_NOW if self.kv_setting else f"f16 for now; 8- and 4-bit {KV_LATER}")
        row = QHBoxLayout()
        row.addWidget(self.kv, 1)
        self.kv_probe_button = QPushButton("KV quality probe…")
        self.kv_probe_button.setEnabled(False)
        self.kv_probe_button.setToolTip(KV_PROBE_LATER)
        row.addWidget(self.kv_probe_button)
        form.addRow("KV precision", row)
        self.sparse: dict[str, QSpinBox] = {}
        for name, label, lo, hi, shown, tip in SPARSE_FIELDS:
            box = QSpinBox()
            box.setRange(lo, hi)
            box.setValue(shown)
            usable = name in known
            box.setEnabled(usable)
            box.setToolTip(tip if usable else f"{tip}; {SPARSE_LATER}")
            self.sparse[name] = box
            form.addRow(label, box)
        layout.addWidget(attention)

        sampling = QGroupBox("Answers")
        form = QFormLayout(sampling)
        self.temperature = self._double(0.0, 2.0, 0.05, "0 = always the most likely token (reproducible)")
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 1000)
        self.top_p = self._double(0.0, 1.0, 0.01)
        self.repeat_penalty = self._double(1.0, 2.0, 0.05)
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 32768)
        self.max_tokens.setSuffix(" tokens")
        self.seed = QSpinBox()
        self.seed.setRange(0, 2**31 - 1)
        for label, w in (("Temperature", self.temperature), ("Top-k", self.top_k), ("Top-p", self.top_p),
                         ("Repeat penalty", self.repeat_penalty), ("Longest answer", self.max_tokens),
                         ("Seed", self.seed)):
            form.addRow(label, w)
        layout.addWidget(sampling)

        machine = QGroupBox("Threads")
        form = QFormLayout(machine)
        self.threads = QSpinBox()
        self.threads.setRange(0, 1024)
        self.threads.setSpecialValueText("auto (one per physical core)")
        self.numa = QComboBox()
        for p in NUMA_POLICIES:
            self.numa.addItem(NUMA_LABELS[p], p)
        form.addRow("Threads", self.threads)
        form.addRow("NUMA policy", self.numa)
        layout.addWidget(machine)

        self.error = info_label("", "error")
        self.error.setVisible(False)
        layout.addWidget(self.error)
        buttons = QDialogButtonBox(QDialogButtonBox.Save | QDialogButtonBox.Cancel
                                   | QDialogButtonBox.RestoreDefaults)
        self.save_button = buttons.button(QDialogButtonBox.Save)
        self.restore_button = buttons.button(QDialogButtonBox.RestoreDefaults)
        self.restore_button.clicked.connect(self.restore_defaults)
        buttons.accepted.connect(self.save)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)

        self._pending_error = ""
        self.model_pending = False
        self.model_ok = True
        self._base = self._current()
        self.load(self._base)
        if self._pending_error:
            self._fail(f"The stored settings could not be used ({self._pending_error}); the defaults are shown.")

    # ---- Public API --------------------------------------------------------

    def load(self, s: Settings) -> None:
        """Show ``s`` in the widgets."""
        self.set_model(s.model)
        self.engine.setCurrentIndex(self.engine.findData(s.engine))
        self.n_ctx.setValue(s.n_ctx)
        self.kv.setCurrentIndex(max(self.kv.findData(getattr(s, "kv", "f16")), 0))
        for name, box in self.sparse.items():
            if hasattr(s, name):
                box.setValue(int(getattr(s, name)))
        self.temperature.setValue(s.temperature)
        self.top_k.setValue(s.top_k)
        self.top_p.setValue(s.top_p)
        self.repeat_penalty.setValue(s.repeat_penalty)
        self.max_tokens.setValue(s.max_tokens)
        self.seed.setValue(s.seed)
        self.threads.setValue(s.threads)
        self.numa.setCurrentIndex(max(self.numa.findData(s.numa), 0))
        self.error.setVisible(False)

    def values(self) -> Settings:
        """The settings the widgets show; raises ValueError with a readable message."""
        changes = dict(model=self.model.text().strip(), engine=self.engine.currentData(),
                       n_ctx=self.n_ctx.value(), temperature=round(self.temperature.value(), 4),
                       top_k=self.top_k.value(), top_p=round(self.top_p.value(), 4),
                       repeat_penalty=round(self.repeat_penalty.value(), 4), max_tokens=self.max_tokens.value(),
                       seed=self.seed.value(), threads=self.threads.value(), numa=self.numa.currentData())
        if self.kv_setting:
            changes["kv"] = self.kv.currentData()
        known = settings_fields()
        changes.update({name: box.value() for name, box in self.sparse.items() if name in known})
        if changes["max_tokens"] >= changes["n_ctx"]:
            raise ValueError(f"the longest answer ({changes['max_tokens']} tokens) must be shorter than the "
                             f"context length ({changes['n_ctx']} tokens)")
        return self._base.with_(**changes)

    def set_model(self, path: str) -> None:
        self.model.setText(path)
        self._model_changed()

    def choose_model(self) -> None:
        start = self.model.text() or str(self.session.paths.models_dir)
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model", start, "GGUF models (*.gguf);;All files (*)")
        if path:
            self.set_model(path)

    def restore_defaults(self) -> None:
        self.load(Settings())

    def save(self) -> bool:
        try:
            s = self.values()
        except ValueError as e:
            return self._fail(str(e))
        if s.model:
            from app.models import ModelError, check_gguf_header, resolve_model

            try:  # the quick checks; a deeper fault is reported when the model is loaded
                check_gguf_header(resolve_model(s.model, self.session.paths.models_dir))
            except ModelError as e:
                return self._fail(str(e))
            if not self.model_pending and not self.model_ok:
                return self._fail(self.model_info.text())
        try:
            self.session.save_settings(s)
        except Exception as e:  # the store is locked or read-only: say so, keep the dialog open
            return self._fail(f"cannot save the settings ({e})")
        self.accept()
        return True

    # ---- Internals -------------------------------------------------------------

    def _current(self) -> Settings:
        try:
            return self.session.settings
        except Exception as e:  # stored values a newer/older eLLM wrote badly: start from the defaults
            self._pending_error = str(e)
            return Settings()

    def _double(self, lo: float, hi: float, step: float, tip: str = "") -> QDoubleSpinBox:
        box = QDoubleSpinBox()
        box.setRange(lo, hi)
        box.setSingleStep(step)
        box.setDecimals(2)
        if tip:
            box.setToolTip(tip)
        return box

    def _model_changed(self) -> None:
        """Show the chosen file's metadata: at once when known, else read in the background."""
        path = self.model.text().strip()
        version = _version(path)
        if version is None:
            from app.models import ModelError, resolve_model

            try:
                resolve_model(path, self.session.paths.models_dir)
                message = f"{path}: cannot read the file"
            except ModelError as e:
                message = str(e)
            self._show_model(message, False)
        elif version in _described:
            self._show_model(*_described[version])
        else:
            self.model_pending = True
            self.model_info.setText("Reading the model's metadata…")
            job = Job(lambda ctl: (version, describe_model(path)))
            job.signals.sig_done.connect(self._described)
            start(job)
            self._model_job = job  # keep it alive until it reports

    def _described(self, result) -> None:
        version, answer = result
        _described[version] = answer
        if _version(self.model.text().strip()) == version:
            self._show_model(*answer)

    def _show_model(self, text: str, ok: bool) -> None:
        self.model_pending = False
        self.model_info.setText(text)
        self.model_info.setProperty("failed", not ok)
        self.model_info.style().unpolish(self.model_info)
        self.model_info.style().polish(self.model_info)
        self.model_ok = ok

    def _fail(self, message: str) -> bool:
        self.error.setText(message)
        self.error.setVisible(True)
        return False

