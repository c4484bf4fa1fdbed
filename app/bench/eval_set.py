"""The answer-quality question set: documents no one here wrote, and questions about them.

A question file (``tests/data/eval/questions.json``) names each document by the Debian
package that ships it, so that the PDFs themselves are never committed (app/bench/eval_docs.py
fetches them), and holds per document the questions, the phrases an answer must contain to
be right and the page that holds the answer:

    {"documents": [{"package": "debian-faq", "version": "11.1",
                    "path": "usr/share/doc/debian/FAQ/debian-faq.en.pdf.gz",
                    "sha256": "<of the PDF, after gunzip when the path ends in .gz>",
                    "pages": 95, "tokens": 31000,
                    "questions": [{"question": "...", "answers": ["...", "..."], "page": 12}]}]}

``pages`` and ``tokens`` (by the default model's tokenizer) are informative. A document may
give ``file`` (a name) instead of ``package``: a local file next to the question file, as the
tests' generated document does.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath


class QuestionSetError(Exception):
    """A question file that cannot be used; the message names the file and the entry."""


@dataclass(frozen=True)
class EvalQuestion:
    question: str
    answers: tuple[str, ...]  # accepted phrases; any one of them found in the answer is right
    page: int                 # 1-based page that holds the answer


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
    qs = tuple(_question(where, i, q) for i, q in enumerate(questions, 1))
    return EvalDocument(name=name, questions=qs, sha256=sha, package=e.get("package", ""),
                        version=e.get("version", ""), path=e.get("path", ""), pages=int(e.get("pages", 0)),
                        tokens=int(e.get("tokens", 0)))


def _question(where: str, index: int, q) -> EvalQuestion:
    where = f"{where}: question {index}"
    if not isinstance(q, dict) or not isinstance(q.get("question"), str) or not q["question"].strip():
        raise QuestionSetError(f"{where}: 'question' is missing")
    answers = q.get("answers")
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
        raise QuestionSetError(f"{where}: 'answers' must be a list of non-empty phrases")
    page = q.get("page")
    if not isinstance(page, int) or isinstance(page, bool) or page < 1:
        raise QuestionSetError(f"{where}: 'page' must be a page number (1-based)")
    return EvalQuestion(q["question"].strip(), tuple(answers), page)
