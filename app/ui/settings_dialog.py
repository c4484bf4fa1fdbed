"""The settings dialog: model, engine, context, KV format, attention, sampling,
threads and NUMA policy, and the local API server. It edits an ``app.settings.Settings`` and saves it through
the session; the defaults are Settings' own (one table). The KV quality probe
(``ellm kv-probe``) runs from here on a document, in the background."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractSpinBox, QCheckBox, QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFileDialog, QFormLayout,
    QGroupBox, QHBoxLayout, QLineEdit, QProgressBar, QPushButton, QSpinBox, QVBoxLayout,
)

from app.runtime.auto import AUTO, SMALL_KV
from app.qa.cache_budget import format_size
from app.qa.doc_cache import budget_of
from app.settings import ATTENTION, AUTO_BUDGET, ENGINES, KV_SETTINGS, NUMA_POLICIES, Settings
from app.ui.widgets import info_label
from app.ui.workers import Job, start

ENGINE_LABELS = {"auto": "Automatic (eLLM when it runs the model)", "ellm": "eLLM", "llamacpp": "llama.cpp"}
KV_TIPS = {"auto": "eLLM chooses: f16, or k8v8 where memory holds the whole document only in it "
                   "(docs/engine.md, \"Automatic settings\")",
           "f16": "16-bit keys and values (exact)", "k8v8": "8-bit keys and values",
           "k8v4": "8-bit keys, 4-bit values (the usual trade: keys are more sensitive)",
           "k4v4": "4-bit keys and values (smallest)"}
KV_NOW = ("KV cache precision of the answers: eLLM stores it in its blocked cache, llama.cpp as q8_0/q4_0; "
          "the KV quality probe shows what it costs in accuracy")
ATTENTION_LABELS = {"auto": "automatic (documents read densely within the model's trained context, long ones "
                            "answered from the voted blocks; beyond it the document read sparsely)",
                    "dense": "dense (every token)", "sparse": "sparse retrieval (sinks, window, top-K blocks)",
                    "sparse-decode": "sparse answers (the document read densely, the answer from the blocks "
                                     "the question chose)"}
ATTENTION_TIP = ("eLLM only (llama.cpp always attends densely). Sparse reads a fixed number of KV blocks per "
                 "token, so long documents decode faster, and it finds facts beyond the model's trained context")
# (label, SparseConfig field or "block", tooltip) of sparse retrieval attention: the engine's defaults,
# shown read-only (they are not settings; `ellm bench --sinks --window --top-k` measures others)
SPARSE_FIELDS = (
    ("Block size (tokens)", "block", "B: tokens per KV block"),
    ("Sink tokens", "sinks", "S: the first tokens every query attends to"),
    ("Local window (tokens)", "window", "W: the most recent tokens every query attends to"),
    ("Retrieved blocks", "top_k", "K: blocks each KV head reads besides the sinks and the window, chosen by the "
                                  "question's votes"),
)
SPARSE_FIXED = "the engine's default; `ellm bench --sinks --window --top-k` measures others"
KV_PROBE_TIP = ("Compares the chosen KV format with f16 on the first 4096 tokens of the selected document "
                "(the first one when none is selected): how much the model's next-token predictions change")
API_TIP = ("Other programs on this computer (editors, scripts, notebooks, OpenAI clients) can ask about your "
           "documents through it; it listens on 127.0.0.1 only, so nothing beyond this computer can reach it")
NUMA_LABELS = {"distribute": "distribute (use every node)", "isolate": "isolate (one node)", "none": "none"}
GiB = 1 << 30


PROBE_START = "KV quality probe…"
PROBE_CANCEL = "Cancel probe"


def sparse_default(name: str, mode: str = "sparse") -> int:
    """The engine's default of a sparse attention option in ``mode`` (its KV block for "block")."""
    if name == "block":
        from app.engine.kv.formats import BLOCK

        return BLOCK
    from app.engine.attention.config import SparseConfig

    return int(SparseConfig(mode=mode).options()[name])


def probe_summary(result, title: str) -> str:
    """One line of a ProbeResult, as the dialog shows it."""
    return (f"{result.kv} against f16 on '{title}', {result.tokens:,} tokens: mean KL {result.mean_kl:.5f}, "
            f"max KL {result.max_kl:.4f}, top-1 agreement {result.top1_agreement:.1%}")


def describe_model(path: str, models_dir: Path | None = None) -> tuple[str, bool]:
    """A readable line of a GGUF file's metadata, or the reason it cannot be used (ok=False).
    Takes seconds on a big vocabulary (gguf parses every field), so the dialog calls it
    in the background and remembers the answer per file version."""
    from app.runtime.model_files import ModelError, default_model_path, read_model_info

    try:
        info = read_model_info(path or default_model_path(models_dir))
    except ModelError as e:
        return str(e), False
    size = f"{info.file_size / GiB:.2f} GiB" if info.file_size >= GiB else f"{info.file_size / 2**20:.0f} MiB"
    return (f"{info.name}: {info.architecture}, {info.parameters / 1e6:,.0f}M parameters, {info.quantization}, "
            f"trained context {info.context_length:,} tokens, {size}"), True


def default_model_name(models_dir: Path) -> str:
    from app.runtime.model_files import ModelError, default_model_path

    try:
        return default_model_path(models_dir).name
    except ModelError:
        return "not installed"


_described: dict[tuple, tuple[str, bool]] = {}  # (path, mtime, size) -> describe_model's answer


def _version(path: str, models_dir: Path | None = None) -> tuple | None:
    """What identifies one version of the model file ("" = the default model)."""
    from app.runtime.model_files import ModelError, default_model_path

    try:
        p = Path(path).expanduser() if path else default_model_path(models_dir)
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
        layout = QVBoxLayout(self)

        model_box = QGroupBox("Model")
        form = QFormLayout(model_box)
        row = QHBoxLayout()
        self.model = QLineEdit()
        self.model.setObjectName("modelPath")
        self.model.setPlaceholderText(f"the default model ({default_model_name(session.paths.models_dir)})")
        self.model.editingFinished.connect(self._model_changed)
        self.choose_model_button = QPushButton("Choose…")
        self.choose_model_button.clicked.connect(self.choose_model)
        self.default_model_button = QPushButton("Default")
        self.default_model_button.setToolTip("Use the default model")
        self.default_model_button.clicked.connect(lambda: self.set_model(""))
        self.catalog_button = QPushButton("Install…")
        self.catalog_button.setToolTip("Models to install, with what they need and how fast they would run here")
        self.catalog_button.clicked.connect(self.open_catalog)
        row.addWidget(self.model, 1)
        row.addWidget(self.choose_model_button)
        row.addWidget(self.catalog_button)
        row.addWidget(self.default_model_button)
        form.addRow("GGUF file", row)
        self.model_info = info_label("", "modelInfo")
        form.addRow("", self.model_info)
        self.engine = QComboBox()
        for e in ENGINES:
            self.engine.addItem(ENGINE_LABELS[e], e)
        form.addRow("Engine", self.engine)
        self.n_ctx = QSpinBox()
        self.n_ctx.setRange(0, 1 << 20)
        self.n_ctx.setSingleStep(1024)
        self.n_ctx.setSuffix(" tokens")
        self.n_ctx.setSpecialValueText("Automatic (the whole document)")   # 0: runtime/auto.py
        self.n_ctx.setToolTip("Prompt and answer together. Automatic: the whole document and the answer, as far "
                              "as memory allows; a longer document is reduced to its most relevant pages")
        form.addRow("Context length", self.n_ctx)
        layout.addWidget(model_box)

        attention = QGroupBox("KV cache and attention")
        form = QFormLayout(attention)
        self.kv = QComboBox()
        for i, name in enumerate(KV_SETTINGS):
            self.kv.addItem(name, name)
            self.kv.setItemData(i, KV_TIPS[name], Qt.ToolTipRole)
        self.kv.setToolTip(KV_NOW)
        row = QHBoxLayout()
        row.addWidget(self.kv, 1)
        self.kv_probe_button = QPushButton(PROBE_START)
        self.kv_probe_button.setObjectName("kvProbe")
        self.kv_probe_button.setToolTip(KV_PROBE_TIP)
        self.kv_probe_button.clicked.connect(self.toggle_probe)
        row.addWidget(self.kv_probe_button)
        form.addRow("KV format", row)
        self.probe_progress = QProgressBar()
        self.probe_progress.setVisible(False)
        form.addRow("", self.probe_progress)
        self.probe_info = info_label("", "kvProbeResult")
        self.probe_info.setVisible(False)
        form.addRow("", self.probe_info)
        self.attention = QComboBox()
        for name in ATTENTION:
            self.attention.addItem(ATTENTION_LABELS[name], name)
        self.attention.setToolTip(ATTENTION_TIP)
        form.addRow("Attention", self.attention)
        self.sparse: dict[str, QSpinBox] = {}
        for label, name, tip in SPARSE_FIELDS:
            box = QSpinBox()
            box.setRange(0, 1 << 20)
            box.setValue(sparse_default(name))
            box.setReadOnly(True)
            box.setButtonSymbols(QAbstractSpinBox.NoButtons)
            box.setToolTip(f"{tip}; {SPARSE_FIXED}")
            self.sparse[name] = box
            form.addRow(label, box)
        self.attention.currentIndexChanged.connect(self._attention_changed)
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

        disk = QGroupBox("Document caches")
        form = QFormLayout(disk)
        self.cache_budget = self._double(-1.0, 1 << 20, 1.0, "Disk for the documents' KV caches: past it, the "
                                         "least recently used are deleted first; a cache larger than the whole "
                                         "budget stays in memory only. 0 keeps none on disk")
        self.cache_budget.setObjectName("cacheBudget")
        self.cache_budget.setDecimals(1)
        self.cache_budget.setSuffix(" GiB")
        budget = budget_of(self.session.store, self.session.paths.cache_dir, Settings())   # the automatic one
        self.cache_budget.setSpecialValueText(f"automatic ({format_size(budget.budget)}: a share of the disk)")
        self.read_ahead_share = QSpinBox()
        self.read_ahead_share.setObjectName("readAheadShare")
        self.read_ahead_share.setRange(0, 100)
        self.read_ahead_share.setSuffix(" % of the budget")
        self.read_ahead_share.setToolTip("Reading ahead stops here for documents nobody opened, asked about or "
                                         "summarized, so it never pushes out the caches of those a person used")
        form.addRow("Cache budget", self.cache_budget)
        form.addRow("Reading ahead up to", self.read_ahead_share)
        layout.addWidget(disk)

        api_box = QGroupBox("Local API server")
        form = QFormLayout(api_box)
        self.api_server = QCheckBox("Serve a local OpenAI-compatible API")
        self.api_server.setObjectName("apiServer")
        self.api_server.setToolTip(API_TIP)
        form.addRow(self.api_server)
        self.api_port = QSpinBox()
        self.api_port.setObjectName("apiPort")
        self.api_port.setRange(1, 65535)
        self.api_port.setToolTip("The port on 127.0.0.1 it listens on")
        form.addRow("Port", self.api_port)
        self.api_info = info_label("", "apiInfo")
        form.addRow("", self.api_info)
        self.api_server.toggled.connect(self._api_changed)
        self.api_port.valueChanged.connect(self._api_changed)
        layout.addWidget(api_box)

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
        self.probe_job: Job | None = None
        self.probe_result = None  # the last ProbeResult shown
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
        self.kv.setCurrentIndex(max(self.kv.findData(s.kv), 0))
        self.attention.setCurrentIndex(max(self.attention.findData(s.attention), 0))
        self._attention_changed()
        self.temperature.setValue(s.temperature)
        self.top_k.setValue(s.top_k)
        self.top_p.setValue(s.top_p)
        self.repeat_penalty.setValue(s.repeat_penalty)
        self.max_tokens.setValue(s.max_tokens)
        self.seed.setValue(s.seed)
        self.threads.setValue(s.threads)
        self.numa.setCurrentIndex(max(self.numa.findData(s.numa), 0))
        self.api_server.setChecked(s.api_server)
        self.api_port.setValue(s.api_port)
        self.cache_budget.setValue(-1.0 if s.cache_budget == AUTO_BUDGET else s.cache_budget / (1 << 30))
        self.read_ahead_share.setValue(round(s.read_ahead_share * 100))
        self._api_changed()
        self.error.setVisible(False)

    def values(self) -> Settings:
        """The settings the widgets show; raises ValueError with a readable message."""
        changes = dict(model=self.model.text().strip(), engine=self.engine.currentData(),
                       n_ctx=self.n_ctx.value(), temperature=round(self.temperature.value(), 4),
                       top_k=self.top_k.value(), top_p=round(self.top_p.value(), 4),
                       repeat_penalty=round(self.repeat_penalty.value(), 4), max_tokens=self.max_tokens.value(),
                       seed=self.seed.value(), threads=self.threads.value(), numa=self.numa.currentData(),
                       kv=self.kv.currentData(), attention=self.attention.currentData(),
                       api_server=self.api_server.isChecked(), api_port=self.api_port.value(),
                       cache_budget=(AUTO_BUDGET if self.cache_budget.value() < 0
                                     else round(self.cache_budget.value() * (1 << 30))),
                       read_ahead_share=self.read_ahead_share.value() / 100)
        if changes["n_ctx"] and changes["max_tokens"] >= changes["n_ctx"]:
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

    def open_catalog(self):
        """The model catalogue (app/ui/model_picker.py); an installed model chosen there is used."""
        from app.ui.model_picker import ModelPicker

        picker = ModelPicker(self.session.paths.models_dir, self)
        picker.sig_chosen.connect(self.set_model)
        picker.open()
        self.picker = picker
        return picker

    def restore_defaults(self) -> None:
        self.load(Settings())

    def save(self) -> bool:
        try:
            s = self.values()
        except ValueError as e:
            return self._fail(str(e))
        if s.model:
            from app.runtime.model_files import ModelError, check_gguf_header, resolve_model

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
        if s.cache_budget != self._base.cache_budget:     # a smaller budget applies at once
            self.session.store.clear_cache_notes()
            budget_of(self.session.store, self.session.paths.cache_dir, s).prune()
        self.accept()
        return True

    def toggle_probe(self) -> None:
        """Start the KV quality probe on the selected document, or cancel the one running."""
        if self.probe_job is not None:
            self.probe_job.cancel()
            self.kv_probe_button.setEnabled(False)  # until the job stops at its next chunk
            self._probe_message("Cancelling…")
            return
        from app.runtime.model_files import ModelError, resolve_model

        doc = self._probe_document()
        if doc is None:
            self._probe_message("Add a document to the library first: the probe runs on a document.", True)
            return
        try:
            model_path = resolve_model(self.model.text().strip(), self.session.paths.models_dir)
        except ModelError as e:
            self._probe_message(str(e), True)
            return
        kv, threads, numa = self.kv.currentData(), self.threads.value(), self.numa.currentData()
        if kv == AUTO:
            kv = SMALL_KV       # f16 is the probe's reference: the format auto falls back to is what it measures
        store = self.session.store

        def work(ctl):  # a ProbeError's message reaches sig_error as it is
            from app.runtime.kv_probe import PROBE_TOKENS, probe_document

            return doc, probe_document(store, doc, model_path, kv, PROBE_TOKENS, threads, numa,
                                       progress=lambda done, total: ctl.progress(done, total, "tokens"),
                                       cancel=ctl.cancelled)

        job = Job(work)
        job.signals.sig_progress.connect(self._probe_progress)
        job.signals.sig_done.connect(self._probe_done)
        job.signals.sig_error.connect(lambda message: self._probe_message(message, True))
        job.signals.sig_finished.connect(self._probe_finished)
        self.probe_job = job
        self.probe_result = None
        self.kv_probe_button.setText(PROBE_CANCEL)
        self.probe_progress.setRange(0, 0)  # busy until the first chunk reports
        self.probe_progress.setVisible(True)
        self._probe_message(f"Probing {kv} against f16 on '{doc['title']}' with {model_path.name}…")
        start(job)

    def done(self, result: int) -> None:
        """Closing the dialog (Save, Cancel, Esc) stops the probe at its next chunk."""
        if self.probe_job is not None:
            self.probe_job.cancel()
        super().done(result)

    # ---- Internals -------------------------------------------------------------

    def _probe_document(self) -> dict | None:
        """The document selected in the window's library, else the first ingested one."""
        store = self.session.store
        library = getattr(self.parent(), "library", None)
        ids = library.selected_ids() if library is not None else []
        for doc_id in ids:
            doc = store.document(doc_id)
            if doc is not None and doc["pages"]:
                return doc
        return next((d for d in store.documents() if d["status"] == "ingested" and d["pages"]), None)

    def _probe_progress(self, done: int, total: int, what: str) -> None:
        self.probe_progress.setRange(0, total)
        self.probe_progress.setValue(done)
        self.probe_progress.setFormat(f"%v / %m {what}")

    def _probe_done(self, answer) -> None:
        doc, result = answer
        if result is None:
            self._probe_message("The KV probe was cancelled.")
            return
        self.probe_result = result
        self._probe_message(probe_summary(result, doc["title"]))

    def _probe_finished(self) -> None:
        self.probe_job = None
        self.probe_progress.setVisible(False)
        self.kv_probe_button.setText(PROBE_START)
        self.kv_probe_button.setEnabled(True)

    def _probe_message(self, text: str, failed: bool = False) -> None:
        self.probe_info.setText(text)
        self.probe_info.setProperty("failed", failed)
        self.probe_info.style().unpolish(self.probe_info)
        self.probe_info.style().polish(self.probe_info)
        self.probe_info.setVisible(True)

    def _api_changed(self) -> None:
        """Where the server serves (the window's ApiSwitch), or where it would once saved."""
        switch = getattr(self.parent(), "api", None)
        port = self.api_port.value()
        now = switch.describe() if switch is not None else ""
        serving = switch is not None and switch.running and switch.port == port
        if self.api_server.isChecked() and serving:
            text = now
        elif self.api_server.isChecked():
            text = f"Serves at http://127.0.0.1:{port}/v1 once saved" + (f" ({now})" if now and not serving else "")
        else:
            text = "Off" + (" once saved" if switch is not None and switch.running else "") + \
                f": other programs cannot use eLLM (when on: http://127.0.0.1:{port}/v1)"
        self.api_info.setText(text)

    def _attention_changed(self) -> None:
        """The sparse options matter (and are shown enabled) only with sparse attention."""
        mode = self.attention.currentData()
        shown = mode if mode in ("sparse", "sparse-decode") else "sparse-decode"   # auto: beyond 8K tokens
        for name, box in self.sparse.items():
            box.setValue(sparse_default(name, shown))
            box.setEnabled(mode != "dense")


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
        models_dir = self.session.paths.models_dir
        version = _version(path, models_dir)
        if version is None:
            from app.runtime.model_files import ModelError, resolve_model

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
            job = Job(lambda ctl: (version, describe_model(path, models_dir)))
            job.signals.sig_done.connect(self._described)
            start(job)
            self._model_job = job  # keep it alive until it reports

    def _described(self, result) -> None:
        version, answer = result
        _described[version] = answer
        if _version(self.model.text().strip(), self.session.paths.models_dir) == version:
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

