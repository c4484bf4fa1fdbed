"""The answer-quality question set: documents no one here wrote, and questions about them.

A question file (``tests/data/eval/questions.json``) names each document by the Debian
package that ships it, so that the PDFs themselves are never committed (app/bench/eval_docs.py
fetches them), and holds per document the half of the set it belongs to, the questions, the
phrases an answer must contain to be right and the pages that hold the answer:

    {"documents": [{"package": "debian-faq", "version": "11.1",
                    "path": "usr/share/doc/debian/FAQ/debian-faq.en.pdf.gz",
                    "sha256": "<of the PDF, after gunzip when the path ends in .gz>",
                    "pages": 95, "tokens": 31000, "half": "tuning",
                    "questions": [
                      {"question": "...", "answers": ["...", "..."], "page": 12, "wrong": ["..."]},
                      {"question": "... and ...?", "pages": [8, 21], "parts": [["..."], ["...", "..."]]}]}]}

A single-page question gives ``answers`` (any one of them found in an answer is right) and its
``page``; a two-page question gives its ``pages`` (at least MIN_APART apart) and ``parts``, one
list of phrases per fact, every part needed. ``wrong`` names the other candidates the document
offers: an answer that names one of them is wrong, whatever else it says (an answer that lists
several candidates is not an answer). ``half`` is "tuning" (settings may be chosen on these
questions) or "held-out" (only reported); default "tuning". ``pages`` and ``tokens`` (by the
default model's tokenizer) of a document are informative. A document may give ``file`` (a name)
instead of ``package``: a local file next to the question file, as the tests' generated
document does.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from app.bench.eval_score import normalise


HALVES = ("tuning", "held-out")
SINGLE, TWO_PAGE = "single", "two-page"
MIN_APART = 5             # pages between the two facts of a two-page question, at least


class QuestionSetError(Exception):
    """A question file that cannot be used; the message names the file and the entry."""


@dataclass(frozen=True)
class EvalQuestion:
    question: str
    parts: tuple[tuple[str, ...], ...]   # per fact the accepted phrases; a right answer has one of each
    pages: tuple[int, ...]               # 1-based pages that hold the facts, one a part
    wrong: tuple[str, ...] = ()          # other candidates: an answer naming one is wrong

    @property
    def page(self) -> int:
        return self.pages[0]

    @property
    def answers(self) -> tuple[str, ...]:
        """Every accepted phrase."""
        return tuple(a for part in self.parts for a in part)

    @property
    def kind(self) -> str:
        return TWO_PAGE if len(self.pages) > 1 else SINGLE


@dataclass(frozen=True)
class EvalDocument:
    name: str                 # the PDF's file name (cache key and what the table shows)
    questions: tuple[EvalQuestion, ...]
    sha256: str
    package: str = ""         # Debian package that ships it ("" for a local file)
    version: str = ""
    path: str = ""            # the PDF's path inside the .deb (may end in .gz)
    pages: int = 0
    tokens: int = 0
    half: str = "tuning"

    @property
    def local(self) -> bool:
        return not self.package


@dataclass(frozen=True)
class QuestionSet:
    source: Path              # the question file
    documents: tuple[EvalDocument, ...]

    def limited(self, limit: int | None) -> "QuestionSet":
        """The first ``limit`` questions of each document (all when None)."""
        if limit is None:
            return self
        docs = tuple(EvalDocument(**{**d.__dict__, "questions": d.questions[:limit]}) for d in self.documents)
        return QuestionSet(self.source, docs)

    def half(self, half: str | None) -> "QuestionSet":
        """The documents of one half of the set ("tuning" or "held-out"); all when None."""
        if half is None:
            return self
        if half not in HALVES:
            raise QuestionSetError(f"{self.source}: no half named {half!r}; the halves are {', '.join(HALVES)}")
        return QuestionSet(self.source, tuple(d for d in self.documents if d.half == half))

    def only(self, names: list[str] | None) -> "QuestionSet":
        """The documents named (by file name), in the file's order; all when None."""
        if not names:
            return self
        known = [d.name for d in self.documents]
        unknown = [n for n in names if n not in known]
        if unknown:
            raise QuestionSetError(f"{self.source}: no document named {', '.join(unknown)}; "
                                   f"the documents are {', '.join(known)}")
        return QuestionSet(self.source, tuple(d for d in self.documents if d.name in names))

    @property
    def n_questions(self) -> int:
        return sum(len(d.questions) for d in self.documents)


def pdf_name(member: str) -> str:
    """The file name a member of a .deb is cached under: its base name without ``.gz``."""
    name = PurePosixPath(member).name
    return name[:-3] if name.endswith(".gz") else name


def load_question_set(path: str | Path) -> QuestionSet:
    """Read and check a question file; every problem names the file and the entry."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise QuestionSetError(f"{path}: cannot read the question file ({e.strerror or e})") from e
    except json.JSONDecodeError as e:
        raise QuestionSetError(f"{path}: not valid JSON ({e})") from e
    entries = data.get("documents") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise QuestionSetError(f'{path}: expected {{"documents": [...]}} with at least one document')
    docs = [_document(path, i, e) for i, e in enumerate(entries, 1)]
    names = [d.name for d in docs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise QuestionSetError(f"{path}: two documents have the same file name: {', '.join(twice)}")
    return QuestionSet(path, tuple(docs))


def _document(path: Path, index: int, e) -> EvalDocument:
    where = f"{path}: document {index}"
    if not isinstance(e, dict):
        raise QuestionSetError(f"{where}: expected an object")
    if e.get("package"):
        for key in ("version", "path", "sha256"):
            if not isinstance(e.get(key), str) or not e[key]:
                raise QuestionSetError(f"{where} ({e['package']}): '{key}' is missing")
        name = pdf_name(e["path"])
    elif isinstance(e.get("file"), str) and e["file"] and isinstance(e.get("sha256"), str):
        name = e["file"]
    else:
        raise QuestionSetError(f"{where}: give 'package', 'version', 'path' and 'sha256' (or 'file' and 'sha256')")
    where = f"{path}: {name}"
    sha = e["sha256"].lower()
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise QuestionSetError(f"{where}: 'sha256' is not 64 hex digits")
    questions = e.get("questions")
    if not isinstance(questions, list) or not questions:
        raise QuestionSetError(f"{where}: no questions")
    half = e.get("half", "tuning")
    if half not in HALVES:
        raise QuestionSetError(f"{where}: 'half' must be one of {', '.join(HALVES)}, not {half!r}")
    qs = tuple(_question(where, i, q) for i, q in enumerate(questions, 1))
    return EvalDocument(name=name, questions=qs, sha256=sha, package=e.get("package", ""),
                        version=e.get("version", ""), path=e.get("path", ""), pages=int(e.get("pages", 0)),
                        tokens=int(e.get("tokens", 0)), half=half)


def _question(where: str, index: int, q) -> EvalQuestion:
    where = f"{where}: question {index}"
    if not isinstance(q, dict) or not isinstance(q.get("question"), str) or not q["question"].strip():
        raise QuestionSetError(f"{where}: 'question' is missing")
    if "parts" in q:
        pages, parts = q.get("pages"), q["parts"]
        if not isinstance(parts, list) or len(parts) < 2 or not all(_phrases(p) for p in parts):
            raise QuestionSetError(f"{where}: 'parts' must be a list of at least two lists of non-empty phrases")
        if not isinstance(pages, list) or len(pages) != len(parts) or not all(_page(p) for p in pages):
            raise QuestionSetError(f"{where}: 'pages' must give one page number (1-based) per part")
        if max(pages) - min(pages) < MIN_APART:
            raise QuestionSetError(f"{where}: the pages of a two-page question must be at least {MIN_APART} apart")
        parts = tuple(tuple(p) for p in parts)
    else:
        if not _phrases(q.get("answers")):
            raise QuestionSetError(f"{where}: 'answers' must be a list of non-empty phrases")
        if not _page(q.get("page")):
            raise QuestionSetError(f"{where}: 'page' must be a page number (1-based)")
        pages, parts = [q["page"]], (tuple(q["answers"]),)
    wrong = q.get("wrong", [])
    if wrong and not _phrases(wrong):
        raise QuestionSetError(f"{where}: 'wrong' must be a list of non-empty phrases")
    inside = [(w, a) for w in wrong for part in parts for a in part if normalise(w) in normalise(a)]
    if inside:
        raise QuestionSetError(f"{where}: the wrong phrase {inside[0][0]!r} is part of the accepted {inside[0][1]!r}")
    return EvalQuestion(q["question"].strip(), parts, tuple(pages), tuple(wrong))


def _phrases(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(a, str) and a.strip() for a in value)


def _page(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
