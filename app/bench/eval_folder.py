"""``ellm eval QUESTIONS.json --folder-trials N``: one fact planted in one of eight real
documents, asked across all of them as ``ellm ask --folder`` asks it.

The documents are cut from the question set's manuals (real text that no one here wrote): eight
documents of about 3,000 tokens of consecutive pages, taken in turn from each manual and spread
over it, written as text files. A trial plants one invented fact (``FACTS``: a sentence, the
question it answers, the accepted phrases) at a random depth of one random document, ingests that
planted copy as a document of its own, and asks the fact's question across the eight (the planted
copy in the place of its original) through the answer service, in each mode of
app/bench/eval_run.py. The seven others are the same documents in every trial, so with a blocked
cache they are read once for all trials and modes, as a person's folder is.

Scored per trial (app/bench/eval_score.py's rules): **right**, an accepted phrase in the answer;
**cited**, a page of the planted document that the answer cites or attended to is the fact's page
or its neighbour; **whole**, every page of the eight documents was in the answer's context (none
left out, no relevance selection). The trials are the same in every mode (fixed seed).
"""
from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from app.bench.eval_run import (EvalConfig, EvalMode, EvalReport, ReadingLines, base_settings, format_summary,
                                ingest_documents, open_mode, summarise, verdict)
from app.bench.eval_score import answer_right, citation_right, pointed_pages
from app.qa.answer import AskError, answer
from app.qa.pages import PageText, load_pages
from app.qa.stream import Listeners
from app.runtime.model_files import ModelError
from app.session import Session, SessionError
from app.settings import Paths

FOLDER_SUBDIR = "folder-trials"


@dataclass(frozen=True)
class Fact:
    """An invented fact: the sentence planted, the question it answers, phrases that answer it."""

    sentence: str
    question: str
    answers: tuple[str, ...]


# Invented, so that no manual holds them; each answer is a phrase no manual of the set contains.
FACTS = (
    Fact("The spare key to the machine room is kept in the green tin behind the library's front desk.",
         "Where is the spare key to the machine room kept?", ("green tin",)),
    Fact("The licence code for the plotting workstation is QX-7731-LM.",
         "What is the licence code for the plotting workstation?", ("QX-7731-LM",)),
    Fact("The backup tapes of the archive are collected every Thursday by Marta Kowalczyk.",
         "Who collects the backup tapes of the archive?", ("Kowalczyk",)),
    Fact("The documentation team holds its yearly retreat in the town of Tromsø.",
         "Where does the documentation team hold its yearly retreat?", ("Tromsø", "Tromso")),
    Fact("The mirror in Reykjavik is synchronised every 37 minutes.",
         "How often is the mirror in Reykjavik synchronised?", ("37 minutes", "thirty-seven minutes")),
    Fact("The operators nicknamed the old test cluster Marigold.",
         "What nickname did the operators give the old test cluster?", ("Marigold",)),
    Fact("Uploads from the Lisbon office are signed with the key whose fingerprint ends in 9F3C.",
         "How does the fingerprint of the key that signs uploads from the Lisbon office end?", ("9F3C",)),
    Fact("The print server in building C is called Heron.",
         "What is the print server in building C called?", ("Heron",)),
)


@dataclass(frozen=True)
class FolderTrials:
    trials: int
    n_docs: int = 8
    doc_tokens: int = 3000
    seed: int = 0


@dataclass(frozen=True)
class Trial:
    number: int          # from 1
    fact: Fact
    slot: int            # which of the documents holds the fact (0-based)
    depth: float         # where in it, as a share of its text
    path: Path           # the planted copy


class FolderReport(EvalReport):
    """An EvalReport whose rows are trials (no halves or kinds of question)."""

    COUNTED = "trials"

    def summary(self) -> list[dict]:
        return summarise(self.rows, [m["name"] for m in self.config["modes"]], self.COUNTED)


def cut_documents(manuals: list[list[PageText]], n_docs: int, doc_tokens: int) -> list[tuple[str, str]]:
    """``n_docs`` (name, text) documents of whole consecutive pages, as many as ``doc_tokens``
    tokens hold (at least one), taken in turn from each manual and spread over it (the k-th of a
    manual's share starts k/share of the way in)."""
    shares = [len(range(m, n_docs, len(manuals))) for m in range(len(manuals))]
    docs = []
    for i in range(n_docs):
        m, k = i % len(manuals), i // len(manuals)
        pages = manuals[m]
        start = k * len(pages) // shares[m]
        taken, tokens = [], 0
        for p in pages[start:]:
            if taken and tokens + p.tokens > doc_tokens:
                break
            if p.text.strip():
                taken.append(p.text.strip())
                tokens += p.tokens
        stem = re.sub(r"[^A-Za-z0-9]+", "-", pages[0].title).strip("-").lower()[:40] or f"manual{m + 1}"
        docs.append((f"{i + 1:02d}-{stem}-part{k + 1}.txt", "\n\n".join(taken)))
    return docs


def plant(text: str, sentence: str, depth: float) -> str:
    """``sentence`` inserted at the first sentence end at or after ``depth`` of ``text`` (at
    its end if none follows)."""
    at = int(len(text) * depth)
    end = re.compile(r"[.!?]\s").search(text, at)
    if end is None:
        return text.rstrip() + " " + sentence
    return text[:end.end()] + sentence + " " + text[end.end():]


def make_trials(spec: FolderTrials, docs: list[tuple[str, str]], folder: Path) -> list[Trial]:
    """The trials' planted copies written under ``folder`` (trial-NN/<the document's name>)."""
    rng = random.Random(spec.seed)
    facts = list(FACTS)
    rng.shuffle(facts)
    trials = []
    for t in range(spec.trials):
        fact, slot, depth = facts[t % len(facts)], rng.randrange(len(docs)), round(rng.uniform(0.1, 0.9), 3)
        name, text = docs[slot]
        path = folder / f"trial-{t + 1:02d}" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(plant(text, fact.sentence, depth), encoding="utf-8")
        trials.append(Trial(t + 1, fact, slot, depth, path))
    return trials


def fact_page(store, doc_id: int, fact: Fact) -> int:
    """The page of the planted document that holds the fact's answer."""
    for row in store.pages(doc_id):
        if answer_right(row["text"], fact.answers):
            return int(row["number"])
    raise AskError(f"document {doc_id}: the planted fact is on none of its pages")


def run_folder_trials(cfg: EvalConfig, spec: FolderTrials, files: list[Path],
                      progress: Callable[[str], None] = lambda what: None) -> FolderReport:
    """The trials of ``spec`` over documents cut from ``files`` (the question set's), per mode."""
    paths, base = Paths(cfg.data_dir), base_settings(cfg)
    report = FolderReport(config={"model": str(cfg.model), "max_tokens": cfg.max_tokens, "base": base,
                                  "data_dir": str(cfg.data_dir), "trials": spec.trials, "n_docs": spec.n_docs,
                                  "doc_tokens": spec.doc_tokens, "seed": spec.seed,
                                  "modes": [{"name": m.name, "description": m.description,
                                             "overrides": m.overrides()} for m in cfg.modes]})
    session = Session(paths, base)
    count = session.token_counter()
    manuals = [load_pages(session.store, [row["id"]], count) for row in ingest_documents(session, files, progress)]
    folder = Path(cfg.data_dir) / FOLDER_SUBDIR
    base_dir = folder / "documents"
    base_dir.mkdir(parents=True, exist_ok=True)
    docs = cut_documents(manuals, spec.n_docs, spec.doc_tokens)
    for name, text in docs:
        (base_dir / name).write_text(text, encoding="utf-8")
    trials = make_trials(spec, docs, folder)
    stored = ingest_documents(session, [base_dir / name for name, _ in docs], progress)
    planted = ingest_documents(session, [t.path for t in trials], progress)
    report.documents = [{"name": name, "doc_id": row["id"], "pages": row["pages"], "tokens": session.model_tokens(row)}
                        for (name, _), row in zip(docs, stored)]
    ids = [row["id"] for row in stored]
    # the backend is sized for the trial whose documents are the longest
    widest = max((stored[:t.slot] + [p] + stored[t.slot + 1:] for t, p in zip(trials, planted)),
                 key=lambda rows: session.doc_tokens([r["id"] for r in rows]))
    total = len(trials) * len(cfg.modes)
    done = 0
    for mode in cfg.modes:
        try:
            mode_session, backend, ctx_note = open_mode(cfg, paths, mode, widest, count, session.backends)
        except (SessionError, ModelError, ValueError) as e:
            report.skipped.append({"mode": mode.name, "reason": str(e)})
            progress(f"{mode.name}: skipped: {e}")
            report.rows += [trial_row(mode, t, docs, -1, {"error": str(e)}) for t in trials]
            done += len(trials)
            continue
        params = mode_session.sampling()
        for t, p in zip(trials, planted):
            done += 1
            asked = ids[:t.slot] + [p["id"]] + ids[t.slot + 1:]
            r = ask_trial(mode_session, backend, params, mode, t, docs, asked, p["id"], ctx_note, progress)
            report.rows.append(r)
            read = f"{r['considered']} of {spec.n_docs} documents"
            progress(f"[{done}/{total}] {mode.name} trial {t.number} (document {t.slot + 1} at {t.depth:.0%}): "
                     f"{verdict(r, read)}")
    return report


def ask_trial(session: Session, backend, params, mode: EvalMode, trial: Trial, docs, doc_ids: list[int],
              planted_id: int, ctx_note: str, progress: Callable[[str], None]) -> dict:
    fact = trial.fact
    t0 = time.perf_counter()
    try:
        page = fact_page(session.store, planted_id, fact)
        result = answer(session.store, backend, fact.question, doc_ids, params,
                        Listeners(progress=ReadingLines(progress)), save=False, options=mode.options())
    except (AskError, ValueError) as e:
        return trial_row(mode, trial, docs, -1, {"error": str(e), "total_s": round(time.perf_counter() - t0, 3)})
    cited, attended = pointed_pages(result, planted_id)
    all_pages = {(d, r["number"]) for d in doc_ids for r in session.store.pages(d)}
    used = {(pg.doc_id, pg.number) for pg in result.plan.pages}
    t = result.timings
    row = {"answer": result.answer, "right": answer_right(result.answer, fact.answers),
           "cited": citation_right(result, planted_id, page), "whole": used >= all_pages,
           "cited_pages": cited, "attended_pages": attended,
           "considered": len(result.considered) if result.considered is not None else len({d for d, _ in used}),
           "pages_used": len(used & all_pages), "total_pages": len(all_pages), "engine": result.engine,
           "n_ctx": backend.n_ctx, "context_note": ctx_note or result.notes,
           "ttft_s": t.get("first_token_s") or None, "total_s": t.get("total_s", round(time.perf_counter() - t0, 3)),
           "prompt_tokens": t.get("prompt_tokens"), "kv_cache": t.get("kv_cache"), "timings": t, "error": ""}
    return trial_row(mode, trial, docs, page, row)


FAILED = {"answer": "", "right": False, "cited": False, "whole": False, "cited_pages": [], "attended_pages": [],
          "considered": 0, "pages_used": 0, "total_pages": 0, "engine": "", "context_note": "", "total_s": 0.0,
          "timings": {}}


def trial_row(mode: EvalMode, trial: Trial, docs, page: int, row: dict) -> dict:
    """A trial's row: what was planted where, then the answer's scores (``row``; a failed
    trial's row has only its ``error``, the rest as for a question never answered)."""
    out = {"mode": mode.name, "trial": trial.number, "question": trial.fact.question,
           "accepted": list(trial.fact.answers), "document": docs[trial.slot][0], "slot": trial.slot + 1,
           "depth": trial.depth, "page": page}
    keep = ("answer", "right", "cited", "whole", "cited_pages", "attended_pages", "considered", "pages_used",
            "total_pages", "engine", "n_ctx", "context_note", "ttft_s", "total_s", "prompt_tokens", "kv_cache",
            "timings", "error")
    out.update({k: row.get(k, FAILED.get(k)) for k in keep})
    return out


def format_folder_table(report: FolderReport) -> str:
    lines = [format_summary(report.summary(), "trials")]
    lines.append(f"  {report.config['n_docs']} documents of about {report.config['doc_tokens']} tokens each, "
                 f"one fact planted in one of them per trial")
    return "\n".join(lines)


__all__ = ["FACTS", "Fact", "FolderReport", "FolderTrials", "cut_documents", "format_folder_table", "make_trials",
           "plant", "run_folder_trials"]
