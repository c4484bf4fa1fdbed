"""``ellm eval``: answer quality measured on real documents, per mode side by side.

Every question of the set (app/bench/eval_set.py) is asked through the one answer service
(app/qa/answer.py ``answer``, as ``ellm ask`` asks it, through a Session of the evaluation's own
data directory) in each mode, and scored (app/bench/eval_score.py): right, cited, whole
document read, and the seconds it took (first token and total, from the call to the service).

A mode is a set of settings overrides (``MODES``, the one table); what a mode does not choose
is the settings' default, with the command line's ``--engine``/``--threads`` beneath the mode's
own choices. The questions of one document are asked one after another on one backend, so the
document's prefix cache is computed by its first question and reused by the others, as in the
app; each row says which (``kv_cache``).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from app.bench.eval_score import score
from app.bench.eval_set import HALVES, SINGLE, TWO_PAGE, EvalDocument, QuestionSet
from app.engine.kv.sizes import CONTEXT_MULTIPLE, MIN_CONTEXT, KVShape, kv_bytes_per_token, max_context
from app.bench.eval_baselines import answer_closed, answer_topk
from app.qa.answer import AnswerOptions, AskError, answer
from app.qa.pages import TEMPLATE_OVERHEAD
from app.qa.prompt import SYSTEM_PROMPT
from app.qa.stream import Listeners
from app.runtime.model_files import ModelError, mem_available
from app.session import Session, SessionError
from app.settings import Paths

PAGE_MARKER_TOKENS = 8     # what qa/pages.py adds per page for its "[Page N]" marker
QUESTION_ROOM = 128        # tokens a question of the set may take in the prompt


@dataclass(frozen=True)
class EvalMode:
    """Settings overrides for one column of the comparison, and what its answers read.

    ``whole_context``: the context is sized per document to hold all of it (capped by free
    memory and the model's trained context); ``trained_only``: documents past the model's trained
    context are skipped (dense attention would read them at positions never trained).
    ``source``: what the answers read — the answer service's sources (qa/answer.py
    AnswerOptions: "document", the document read before its first question as after ``ellm
    read``; "passages", the answer before reading) or a baseline (bench/eval_baselines.py:
    "topk", the apps' chunks; "closed", no document). ``beside``, ``parts``: AnswerOptions.beside
    and .parts (None: the product's)."""

    name: str
    description: str
    engine: str | None = None
    n_ctx: int | None = None
    kv: str | None = None
    attention: str | None = None
    whole_context: bool = False
    trained_only: bool = False
    source: str = "document"
    beside: str | None = None
    parts: bool | None = None

    def overrides(self, n_ctx: int | None = None) -> dict:
        """The settings this mode sets (``n_ctx``: the whole-document context it was sized to)."""
        chosen = {"engine": self.engine, "n_ctx": n_ctx if self.whole_context else self.n_ctx, "kv": self.kv,
                  "attention": self.attention}
        return {k: v for k, v in chosen.items() if v is not None}

    def options(self) -> AnswerOptions:
        """What the answer service is asked to answer from (the service's sources only)."""
        chosen = {"beside": self.beside, "parts": self.parts}
        return AnswerOptions(source=self.source, **{k: v for k, v in chosen.items() if v is not None})


MODES = (
    EvalMode("defaults", "the settings as they are, on a read document (read before its first question, as after "
             "`ellm read`): the whole document and the best passages beside the question (copies of their cached "
             "blocks)"),
    EvalMode("passages", "the settings as they are, on a document not read yet: the passages retrieval ranks best, "
             "at once", source="passages"),
    EvalMode("topk", "llama.cpp, the apps' way: the 6 chunks of ~1,000 characters BM25 ranks best, nothing else",
             engine="llamacpp", n_ctx=8192, source="topk"),
    EvalMode("topk-ellm", "eLLM's engine, the apps' way: the 6 chunks of ~1,000 characters BM25 ranks best",
             engine="ellm", n_ctx=8192, source="topk"),
    EvalMode("closed", "the model alone, no document (closed book)", n_ctx=4096, source="closed"),
    EvalMode("whole", "the settings as they are, on a read document, without the passages beside the question",
             beside="none"),
    EvalMode("parts", "the settings as they are, on a read document, a question that asks several things "
             "asked one thing a turn (qa/parts.py)", parts=True),
    EvalMode("beside-text", "the settings as they are, on a read document, the best passages beside the question "
             "as text (prefilled with the question) rather than copies of their cached blocks", beside="text"),
    EvalMode("alone", "the settings as they are, on a read document, the answer reading only the copies of the "
             "best passages' cached blocks beside the question (and the prompt's header)", beside="alone"),
    EvalMode("dense", "eLLM's engine, dense f16 attention over the whole document, nothing beside, where it fits "
             "the model's trained context", engine="ellm", kv="f16", attention="dense", whole_context=True,
             trained_only=True, beside="none"),
    EvalMode("sparse", "eLLM's engine, f16, sparse attention for the document and the answer, a context that holds "
             "the whole document, nothing beside", engine="ellm", kv="f16", attention="sparse", whole_context=True,
             beside="none"),
    EvalMode("sparse-decode", "eLLM's engine, f16, the document read densely and the answer decoded from the blocks "
             "the question chose, a context that holds the whole document, nothing beside", engine="ellm", kv="f16",
             attention="sparse-decode", whole_context=True, beside="none"),
    EvalMode("k8v8", "the settings as they are, on a read document, its KV cache in k8v8 (8-bit keys and values: "
             "half of f16's bytes)", kv="k8v8"),
    EvalMode("k8v4", "the settings as they are, on a read document, its KV cache in k8v4 (8-bit keys, 4-bit "
             "values)", kv="k8v4"),
    EvalMode("rag8k", "llama.cpp, 8192-token context: the relevance selection of whole pages the app falls back to "
             "when a document does not fit", engine="llamacpp", n_ctx=8192, beside="none"),
)
MODE_NAMES = tuple(m.name for m in MODES)
DEFAULT_MODES = ("defaults", "passages", "topk", "topk-ellm", "closed", "dense", "rag8k")   # ellm eval's
FOLDER_MODES = ("defaults", "dense", "rag8k")                                              # --folder-trials'
BASELINES = ("topk", "closed")    # sources answered by bench/eval_baselines.py, one document each


def find_mode(name: str) -> EvalMode:
    for m in MODES:
        if m.name == name:
            return m
    raise ValueError(f"unknown mode '{name}'; choose from {', '.join(MODE_NAMES)}")


@dataclass(frozen=True)
class EvalConfig:
    data_dir: Path               # the evaluation's own data directory (store, KV caches)
    model: Path
    modes: tuple[EvalMode, ...]
    max_tokens: int = 160        # per answer, every mode alike (the questions ask for one fact)
    base: dict = field(default_factory=dict)   # command-line settings beneath every mode (engine, threads)


@dataclass
class EvalReport:
    config: dict
    documents: list[dict] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)

    COUNTED = "questions"    # what a row is, as the summary counts them

    def summary(self) -> list[dict]:
        out = summarise(self.rows, [m["name"] for m in self.config["modes"]], self.COUNTED)
        for s in out:
            s.update(question_groups([r for r in self.rows if r["mode"] == s["mode"]]))
        return out

    def closed_book(self) -> list[dict]:
        """The questions the model answered right with no document (the "closed" mode)."""
        return [{"document": r["document"], "question": r["question"]} for r in self.rows
                if r["mode"] == "closed" and r["right"]]

    def as_dict(self) -> dict:
        return {"config": self.config, "documents": self.documents, "summary": self.summary(),
                "closed_book": self.closed_book(), "rows": self.rows, "skipped": self.skipped}


def question_groups(rows: list[dict]) -> dict:
    """Of one mode's rows: right answers per half and kind of question, and the seconds to the
    first token of each document's first question and of the later ones (medians)."""
    groups = []
    for half in HALVES:
        for kind in (SINGLE, TWO_PAGE):
            mine = [r for r in rows if r["half"] == half and r["kind"] == kind]
            if mine:
                groups.append({"half": half, "kind": kind, "questions": len(mine),
                               "right": sum(1 for r in mine if r["right"])})
    firsts, laters, seen = [], [], set()
    for r in rows:
        if r["error"] or r["ttft_s"] is None:
            continue
        (laters if r["document"] in seen else firsts).append(r["ttft_s"])
        seen.add(r["document"])
    median = lambda xs: round(statistics.median(xs), 3) if xs else None  # noqa: E731
    return {"right_count": sum(1 for r in rows if r["right"]), "groups": groups,
            "first_ttft_s_median": median(firsts), "later_ttft_s_median": median(laters)}


def summarise(rows: list[dict], modes: list[str], counted: str) -> list[dict]:
    """Per mode: how many rows (under the key ``counted``), the shares right, cited and whole,
    median seconds to the first token and in all, and how many failed."""
    out = []
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]
        if not mine:
            continue
        answered = [r for r in mine if not r["error"]]
        ttft = [r["ttft_s"] for r in answered if r["ttft_s"] is not None]
        out.append({"mode": mode, counted: len(mine), "right": share(mine, "right"), "cited": share(mine, "cited"),
                    "whole": share(mine, "whole"),
                    "ttft_s_median": round(statistics.median(ttft), 3) if ttft else None,
                    "total_s_median": round(statistics.median(r["total_s"] for r in answered), 3)
                    if answered else None,
                    "errors": len(mine) - len(answered)})
    return out


def share(rows: list[dict], key: str) -> float:
    return round(sum(1 for r in rows if r[key]) / len(rows), 4) if rows else 0.0


def base_settings(cfg: EvalConfig) -> dict:
    """The settings beneath every mode: the model, the answer's length and the command line's."""
    return {"model": str(cfg.model), "max_tokens": cfg.max_tokens, **{k: v for k, v in cfg.base.items() if v}}


def open_mode(cfg: EvalConfig, paths: Paths, mode: EvalMode, docs: list[dict], count, backends=None):
    """(session, backend, context note) of ``mode`` for the stored documents ``docs`` asked
    about together: a whole-document mode's context sized to hold them, the automatic one
    otherwise, each from their tokens by the model's tokenizer (Session.doc_tokens, as ``ellm
    ask`` sizes it); ``backends``: the run's loaded backends (runtime/backends.py), shared by its
    modes. Raises SessionError, ModelError or ValueError when the mode cannot run here."""
    session = Session(paths, base_settings(cfg), backends)
    tokens, pages = sum(session.model_tokens(d) for d in docs), sum(d["pages"] for d in docs)
    n_ctx, ctx_note = (whole_document_context(cfg.model, tokens, pages, cfg.max_tokens, count)
                       if mode.whole_context else (None, ""))
    trained = KVShape.from_gguf(cfg.model).context_length
    need = whole_document_need(tokens, pages, cfg.max_tokens, count)
    if mode.trained_only and trained and need > trained:
        raise SessionError(f"{mode.name} reads only documents inside the model's trained context: the whole "
                           f"document needs {need} tokens of context; the model was trained for {trained}")
    session = Session(paths, {**base_settings(cfg), **mode.overrides(n_ctx)}, backends)
    if n_ctx is not None and n_ctx < MIN_CONTEXT:
        raise SessionError(f"no context of at least {MIN_CONTEXT} tokens: {ctx_note}")
    return session, session.backend(session.doc_tokens([d["id"] for d in docs])), ctx_note


def verdict(r: dict, reading: str) -> str:
    """A row's progress line: right, cited, ``reading`` (what was read) and the seconds, or its error."""
    if r["error"]:
        return "error: " + r["error"]
    return (f"{'right' if r['right'] else 'wrong'}, {'cited' if r['cited'] else 'not cited'}, {reading}, "
            f"{r['total_s']:.1f} s")


def reading_of(r: dict) -> str:
    """What a row's answer read, in a word."""
    if r["whole"]:
        return "whole"
    return {"passages": "passages", "none": "no document"}.get(r["answered_from"], "selection")


def whole_document_context(model: Path, doc_tokens: int, doc_pages: int, max_tokens: int,
                           count: Callable[[str], int]) -> tuple[int, str]:
    """The context that holds a whole document's prompt and answer, rounded up to 256 tokens;
    capped by what fits in free memory next to the model (f16 cache, app/engine/kv/sizes.py)
    and by the model's trained context. Returns (n_ctx, why it is smaller than asked, or "")."""
    want = whole_document_need(doc_tokens, doc_pages, max_tokens, count)
    shape = KVShape.from_gguf(model)
    free = mem_available()
    fits = max_context(kv_bytes_per_token(shape, "f16"), free, model.stat().st_size) if free else want
    trained = shape.context_length or want
    n_ctx = min(want, fits, trained)
    if n_ctx == want:
        return n_ctx, ""
    if n_ctx == fits:
        return n_ctx, f"the whole document needs {want} tokens of context; {fits} fit in free memory"
    return n_ctx, f"the whole document needs {want} tokens of context; the model was trained for {trained}"


def whole_document_need(doc_tokens: int, doc_pages: int, max_tokens: int, count: Callable[[str], int]) -> int:
    """The context a whole document's prompt and answer need, rounded up to CONTEXT_MULTIPLE."""
    want = (doc_tokens + PAGE_MARKER_TOKENS * doc_pages + count(SYSTEM_PROMPT) + QUESTION_ROOM
            + TEMPLATE_OVERHEAD + max_tokens + CONTEXT_MULTIPLE)
    return -(-want // CONTEXT_MULTIPLE) * CONTEXT_MULTIPLE


def ingest_documents(session: Session, files: list[Path], progress) -> list[dict]:
    """The documents in the evaluation's store (ingested now, or unchanged since last time)."""
    from app.library.ingest import ingest

    report = ingest(session.store, [str(f) for f in files], session.token_counter(),
                    progress=lambda e: progress(f"ingest {e.line()}"))
    docs = []
    for f in files:
        path = str(Path(f).expanduser().absolute())   # as ingestion stores it
        doc = session.store.document_by_path(path)
        if doc is None or not doc["pages"]:
            reason = next((e.reason for e in report.events if e.path == path), "")
            raise AskError(f"{f}: could not be ingested: {reason or 'no pages'}")
        docs.append(doc)
    return docs


def run_eval(cfg: EvalConfig, questions: QuestionSet, files: list[Path],
             progress: Callable[[str], None] = lambda what: None) -> EvalReport:
    """Ask every question of ``questions`` (documents at ``files``, in order) in every mode."""
    paths, base = Paths(cfg.data_dir), base_settings(cfg)
    report = EvalReport(config={"questions": str(questions.source), "model": str(cfg.model),
                                "max_tokens": cfg.max_tokens, "base": base, "data_dir": str(cfg.data_dir),
                                "modes": [{"name": m.name, "description": m.description, "overrides": m.overrides(),
                                           "source": m.source, "beside": m.beside} for m in cfg.modes]})
    session = Session(paths, base)
    backends = session.backends         # one model in memory for the whole run, shared by its modes
    stored = ingest_documents(session, files, progress)
    count = session.token_counter()
    for doc, row in zip(questions.documents, stored):
        report.documents.append({"name": doc.name, "package": doc.package, "version": doc.version,
                                 "half": doc.half, "doc_id": row["id"], "pages": row["pages"],
                                 "tokens": session.model_tokens(row), "questions": len(doc.questions)})
    total = questions.n_questions * len(cfg.modes)
    done = 0
    for mode in cfg.modes:
        for doc, row in zip(questions.documents, stored):
            try:
                mode_session, backend, ctx_note = open_mode(cfg, paths, mode, [row], count, backends)
            except (SessionError, ModelError, ValueError) as e:
                report.skipped.append({"mode": mode.name, "document": doc.name, "reason": str(e)})
                progress(f"{mode.name}: {doc.name}: skipped: {e}")
                for q in doc.questions:
                    report.rows.append(failed_row(mode, doc, q, str(e)))
                done += len(doc.questions)
                continue
            params = mode_session.sampling()
            for q in doc.questions:
                done += 1
                r = ask_one(mode_session, backend, params, mode, doc, row["id"], q, ctx_note, progress)
                report.rows.append(r)
                progress(f"[{done}/{total}] {mode.name} {doc.name} p. {q.page}: "
                         f"{verdict(r, reading_of(r))}")
    return report


class ReadingLines:
    """The answer service's reading progress (tokens read of total, time left) as a line every
    tenth of a document, so a run that spends half an hour reading says how far it is."""

    STEPS = 10

    def __init__(self, progress: Callable[[str], None]):
        self.progress = progress
        self.last, self.next = 0, 0    # in tenths of the document

    def __call__(self, done: int, total: int, line: str) -> None:
        if total <= 0:
            return
        step = done * self.STEPS // total
        if step < self.last:                 # another document (or another read) began
            self.next = min(self.next, step)
        self.last = step
        if step >= self.next:
            self.progress(line)
            self.next = step + 1


def ask_one(session: Session, backend, params, mode: EvalMode, doc: EvalDocument, doc_id: int, q,
            ctx_note: str, progress: Callable[[str], None] = lambda what: None) -> dict:
    t0 = time.perf_counter()
    model_name = session.model_path.name
    try:
        if mode.source == "topk":
            result = answer_topk(session.store, backend, q.question, doc_id, params, model_name)
        elif mode.source == "closed":
            result = answer_closed(backend, q.question, params, model_name)
        else:
            result = answer(session.store, backend, q.question, [doc_id], params,
                            Listeners(progress=ReadingLines(progress)), save=False, options=mode.options())
    except (AskError, ValueError) as e:
        r = failed_row(mode, doc, q, str(e))
        r["total_s"] = round(time.perf_counter() - t0, 3)
        return r
    s = score(result, doc_id, q)
    t = result.timings
    return {**question_keys(mode, doc, q), "answer": result.answer, "right": s.right, "cited": s.cited,
            "whole": s.whole, "cited_pages": s.cited_pages, "attended_pages": s.attended_pages,
            "pages_used": len(result.plan.pages), "total_pages": result.plan.total_pages,
            "answered_from": result.answered_from, "engine": result.engine, "n_ctx": backend.n_ctx,
            "context_note": ctx_note, "ttft_s": t.get("first_token_s") or None,
            "total_s": t.get("total_s", round(time.perf_counter() - t0, 3)),
            "prompt_tokens": t.get("prompt_tokens"), "kv_cache": t.get("kv_cache"), "timings": t, "error": ""}


def question_keys(mode: EvalMode, doc: EvalDocument, q) -> dict:
    """The keys of a row that say which question it is."""
    return {"mode": mode.name, "document": doc.name, "half": doc.half, "kind": q.kind, "question": q.question,
            "page": q.page, "pages": list(q.pages), "accepted": list(q.answers), "parts": [list(p) for p in q.parts],
            "wrong": list(q.wrong)}


def failed_row(mode: EvalMode, doc: EvalDocument, q, error: str) -> dict:
    return {**question_keys(mode, doc, q), "answer": "", "right": False, "cited": False, "whole": False,
            "cited_pages": [], "attended_pages": [], "pages_used": 0, "total_pages": 0, "answered_from": "",
            "engine": mode.engine or "", "n_ctx": None, "context_note": "", "ttft_s": None, "total_s": 0.0,
            "prompt_tokens": None, "kv_cache": None, "timings": {}, "error": error}


def seconds(v: float | None) -> str:
    return f"{v:8.2f}" if v is not None else f"{'-':>8}"


def format_table(report: EvalReport) -> str:
    """Per mode: right answers per half and kind of question and in all, cited %, whole %, median
    seconds to the first token (of each document's first question and of the later ones)."""
    summary = report.summary()
    cols = [(g["half"], g["kind"]) for g in (summary[0]["groups"] if summary else [])]
    head = [f"{h} {k}" for h, k in cols] + ["all"]
    lines = [f"{'mode':<14} " + " ".join(f"{c:>17}" for c in head)
             + f" {'cited':>6} {'whole':>6} {'ttft 1st':>9} {'ttft later':>10}"]
    for s in summary:
        cells = [f"{g['right']}/{g['questions']}" for g in s["groups"]] + [f"{s['right_count']}/{s['questions']}"]
        lines.append(f"{s['mode']:<14} " + " ".join(f"{c:>17}" for c in cells)
                     + f" {s['cited']:>6.0%} {s['whole']:>6.0%} {seconds(s['first_ttft_s_median']):>9}"
                     f" {seconds(s['later_ttft_s_median']):>10}" + (f"  ({s['errors']} errors)" if s["errors"] else ""))
    closed = report.closed_book()
    if closed:
        lines.append(f"answered right with no document (closed book): {len(closed)} questions")
    for d in report.documents:
        lines.append(f"  {d['name']} ({d['half']}): {d['pages']} pages, {d['tokens']} tokens, "
                     f"{d['questions']} questions")
    return "\n".join(lines)


def format_summary(summary: list[dict], counted: str) -> str:
    lines = [f"{'mode':<10} {counted:>9} {'right':>7} {'cited':>7} {'whole':>7} {'ttft s':>8} {'total s':>8}"]
    for s in summary:
        lines.append(f"{s['mode']:<10} {s[counted]:>9} {s['right']:>7.0%} {s['cited']:>7.0%} {s['whole']:>7.0%} "
                     f"{seconds(s['ttft_s_median'])} {seconds(s['total_s_median'])}"
                     + (f"  ({s['errors']} errors)" if s["errors"] else ""))
    return "\n".join(lines)


__all__ = ["EvalConfig", "EvalMode", "EvalReport", "MODES", "MODE_NAMES", "ReadingLines", "base_settings",
           "find_mode", "format_summary", "format_table", "open_mode", "run_eval", "summarise", "verdict",
           "whole_document_context"]
