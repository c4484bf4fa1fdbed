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
from app.bench.eval_set import EvalDocument, QuestionSet
from app.engine.kv.sizes import CONTEXT_MULTIPLE, MIN_CONTEXT, KVShape, kv_bytes_per_token, max_context
from app.qa.answer import AskError, answer
from app.qa.pages import TEMPLATE_OVERHEAD
from app.qa.prompt import SYSTEM_PROMPT
from app.runtime.model_files import ModelError, mem_available
from app.session import Session, SessionError
from app.settings import Paths

PAGE_MARKER_TOKENS = 8     # what qa/pages.py adds per page for its "[Page N]" marker
QUESTION_ROOM = 128        # tokens a question of the set may take in the prompt


@dataclass(frozen=True)
class EvalMode:
    """Settings overrides for one column of the comparison. ``whole_context``: the context is
    sized per document to hold all of it (capped by free memory and the model's trained context)."""

    name: str
    description: str
    engine: str | None = None
    n_ctx: int | None = None
    kv: str | None = None
    attention: str | None = None
    whole_context: bool = False

    def overrides(self, n_ctx: int | None = None) -> dict:
        """The settings this mode sets (``n_ctx``: the whole-document context it was sized to)."""
        chosen = {"engine": self.engine, "n_ctx": n_ctx if self.whole_context else self.n_ctx, "kv": self.kv,
                  "attention": self.attention}
        return {k: v for k, v in chosen.items() if v is not None}


MODES = (
    EvalMode("defaults", "the settings as they are; nothing chosen but the model"),
    EvalMode("dense", "eLLM's engine, dense f16 attention, a context that holds the whole document where it fits",
             engine="ellm", kv="f16", attention="dense", whole_context=True),
    EvalMode("sparse", "eLLM's engine, f16, sparse attention for the document and the answer, a context that holds "
             "the whole document", engine="ellm", kv="f16", attention="sparse", whole_context=True),
    EvalMode("sparse-decode", "eLLM's engine, f16, the document read densely and the answer decoded from the blocks "
             "the question chose, a context that holds the whole document", engine="ellm", kv="f16",
             attention="sparse-decode", whole_context=True),
    EvalMode("rag8k", "llama.cpp, 8192-token context: the relevance selection of pages the app falls back to",
             engine="llamacpp", n_ctx=8192),
)
MODE_NAMES = tuple(m.name for m in MODES)


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
        return summarise(self.rows, [m["name"] for m in self.config["modes"]], self.COUNTED)

    def as_dict(self) -> dict:
        return {"config": self.config, "documents": self.documents, "summary": self.summary(), "rows": self.rows,
                "skipped": self.skipped}


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


def open_mode(cfg: EvalConfig, paths: Paths, mode: EvalMode, docs: list[dict], count):
    """(session, backend, context note) of ``mode`` for the stored documents ``docs`` asked
    about together: a whole-document mode's context sized to hold them, the automatic one
    otherwise, each from their tokens by the model's tokenizer (Session.doc_tokens, as ``ellm
    ask`` sizes it). Raises SessionError, ModelError or ValueError when the mode cannot run here."""
    session = Session(paths, base_settings(cfg))
    tokens, pages = sum(session.model_tokens(d) for d in docs), sum(d["pages"] for d in docs)
    n_ctx, ctx_note = (whole_document_context(cfg.model, tokens, pages, cfg.max_tokens, count)
                       if mode.whole_context else (None, ""))
    session = Session(paths, {**base_settings(cfg), **mode.overrides(n_ctx)})
    if n_ctx is not None and n_ctx < MIN_CONTEXT:
        raise SessionError(f"no context of at least {MIN_CONTEXT} tokens: {ctx_note}")
    return session, session.backend(session.doc_tokens([d["id"] for d in docs])), ctx_note


def verdict(r: dict, reading: str) -> str:
    """A row's progress line: right, cited, ``reading`` (what was read) and the seconds, or its error."""
    if r["error"]:
        return "error: " + r["error"]
    return (f"{'right' if r['right'] else 'wrong'}, {'cited' if r['cited'] else 'not cited'}, {reading}, "
            f"{r['total_s']:.1f} s")


def whole_document_context(model: Path, doc_tokens: int, doc_pages: int, max_tokens: int,
                           count: Callable[[str], int]) -> tuple[int, str]:
    """The context that holds a whole document's prompt and answer, rounded up to 256 tokens;
    capped by what fits in free memory next to the model (f16 cache, app/engine/kv/sizes.py)
    and by the model's trained context. Returns (n_ctx, why it is smaller than asked, or "")."""
    want = (doc_tokens + PAGE_MARKER_TOKENS * doc_pages + count(SYSTEM_PROMPT) + QUESTION_ROOM
            + TEMPLATE_OVERHEAD + max_tokens + CONTEXT_MULTIPLE)
    want = -(-want // CONTEXT_MULTIPLE) * CONTEXT_MULTIPLE
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
                                "modes": [{"name": m.name, "description": m.description, "overrides": m.overrides()}
                                          for m in cfg.modes]})
    session = Session(paths, base)
    stored = ingest_documents(session, files, progress)
    count = session.token_counter()
    for doc, row in zip(questions.documents, stored):
        report.documents.append({"name": doc.name, "package": doc.package, "version": doc.version,
                                 "doc_id": row["id"], "pages": row["pages"], "tokens": session.model_tokens(row),
                                 "questions": len(doc.questions)})
    total = questions.n_questions * len(cfg.modes)
    done = 0
    for mode in cfg.modes:
        for doc, row in zip(questions.documents, stored):
            try:
                mode_session, backend, ctx_note = open_mode(cfg, paths, mode, [row], count)
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
                         f"{verdict(r, 'whole' if r['whole'] else 'selection')}")
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
    try:
        result = answer(session.store, backend, q.question, [doc_id], params, model_name=session.model_path.name,
                        save=False, progress=ReadingLines(progress))
    except (AskError, ValueError) as e:
        r = failed_row(mode, doc, q, str(e))
        r["total_s"] = round(time.perf_counter() - t0, 3)
        return r
    s = score(result, doc_id, q.answers, q.page)
    t = result.timings
    return {"mode": mode.name, "document": doc.name, "question": q.question, "page": q.page,
            "accepted": list(q.answers), "answer": result.answer, "right": s.right, "cited": s.cited,
            "whole": s.whole, "cited_pages": s.cited_pages, "attended_pages": s.attended_pages,
            "pages_used": len(result.plan.pages), "total_pages": result.plan.total_pages,
            "engine": result.engine, "n_ctx": backend.n_ctx, "context_note": ctx_note,
            "ttft_s": t.get("first_token_s") or None, "total_s": t.get("total_s", round(time.perf_counter() - t0, 3)),
            "prompt_tokens": t.get("prompt_tokens"), "kv_cache": t.get("kv_cache"), "timings": t, "error": ""}


def failed_row(mode: EvalMode, doc: EvalDocument, q, error: str) -> dict:
    return {"mode": mode.name, "document": doc.name, "question": q.question, "page": q.page,
            "accepted": list(q.answers), "answer": "", "right": False, "cited": False, "whole": False,
            "cited_pages": [], "attended_pages": [], "pages_used": 0, "total_pages": 0, "engine": mode.engine or "",
            "n_ctx": None, "context_note": "", "ttft_s": None, "total_s": 0.0, "prompt_tokens": None,
            "kv_cache": None, "timings": {}, "error": error}


def seconds(v: float | None) -> str:
    return f"{v:8.2f}" if v is not None else f"{'-':>8}"


def format_table(report: EvalReport) -> str:
    """Per mode: questions, right %, cited %, whole %, median seconds to the first token and in all."""
    lines = [format_summary(report.summary(), "questions")]
    for d in report.documents:
        lines.append(f"  {d['name']}: {d['pages']} pages, {d['tokens']} tokens, {d['questions']} questions")
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
