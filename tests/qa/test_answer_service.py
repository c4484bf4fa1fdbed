"""The answer service (app/qa/answer.py) without a model: what goes into the prompt, what
happens when a document does not fit, which pages are cited, how several documents are laid
side by side, and what is stored. The backend is tests/qa/fake_backend.py."""
from __future__ import annotations

import pytest

from app.engine.backend import SamplingParams
from app.qa.answer import AnswerOptions, AskError, answer
from app.qa.prompt import BESIDE_LEAD, build_prompt
from app.qa.stream import Listeners
from app.store import Store
from tests.qa.fake_backend import FakeBackend

PARAMS = SamplingParams.make_greedy(16)

PAGES = [
    "The lighthouse keeper logbook opens in the spring of the harbour year.",
    "Ships came in with grain and timber; the harbour master counted them every evening.",
    "The secret signal of the harbour was three green lamps above the pier.",
    "In autumn the logbook ends with a storm that closed the harbour for a week.",
]


def add_document(store: Store, path: str, title: str, pages: list[str]) -> int:
    rows, chunks, start = [], [], 0
    for number, text in enumerate(pages, 1):
        rows.append((number, start, text))
        chunks.append((number, start, start + len(text), text))
        start += len(text) + 1
    return store.save_document({"path": path, "title": title, "status": "ingested", "pages": len(pages)},
                               rows, chunks)


def test_a_document_that_fits_is_read_whole_with_its_page_markers(store, model_file):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    backend = FakeBackend(model_file, answer="Three green lamps [p. 3].")
    streamed = []
    a = answer(store, backend, "  What was the secret signal?  ", [doc], PARAMS, Listeners(on_text=streamed.append))
    prompt = backend.detokenize(backend.prompts[0])
    assert [f"[Page {n}]" in prompt for n in range(1, 5)] == [True] * 4
    assert prompt.rstrip().endswith("Question: What was the secret signal? </user>\n<assistant>")
    assert a.answer == "Three green lamps [p. 3]." == "".join(streamed).strip()
    assert not a.plan.truncated and a.plan.note == "" and len(a.plan.pages) == 4
    assert a.timings["kv_cache"] == "miss" and a.timings["prompt_tokens"] == len(backend.prompts[0])
    assert a.considered is None and a.attended == [] and a.doc_ids == [doc]
    assert set(a.as_dict()) == {"answer", "citations", "timings", "engine", "model", "documents", "context",
                                "cancelled", "answer_id", "attended", "answered_from", "note", "thread",
                                "turns_left_out"}
    assert a.answered_from == "document" and a.model == "fake.gguf"    # the backend's model file, recorded


def test_a_document_over_the_context_is_answered_from_its_most_relevant_pages_and_says_so(store, model_file):
    filler = [f"Page {i} tells of nets, ropes, tides and gulls on an ordinary day at sea. " * 6 for i in range(30)]
    pages = filler[:17] + ["The harbour master's secret password was BLUEHERON, kept in the brass box."] + filler[17:]
    doc = add_document(store, "/docs/long.txt", "Long Log", pages)
    backend = FakeBackend(model_file, n_ctx=700, answer="BLUEHERON.")
    a = answer(store, backend, "What was the harbour master's secret password?", [doc], PARAMS)
    used = [p.number for p in a.plan.pages]
    assert 18 in used and 1 in used                     # the page that answers it, and the opening page
    assert used == sorted(used) and len(used) < len(pages)
    assert a.plan.truncated and "chosen by relevance" in a.plan.note and f"of {len(pages)} pages" in a.plan.note
    assert len(backend.prompts[0]) + PARAMS.max_tokens <= backend.n_ctx
    assert a.as_dict()["context"]["truncated"] is True


def test_too_small_a_context_is_refused_with_what_to_change(store, model_file):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    with pytest.raises(AskError, match="raise the context length or lower max tokens"):
        answer(store, FakeBackend(model_file, n_ctx=80), "What was the signal?", [doc], PARAMS)


def test_citations_are_the_pages_the_answer_cites_first_then_the_passages_that_match_it(store, model_file):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    a = answer(store, FakeBackend(model_file, answer="It was three green lamps above the pier [p. 3]."),
               "What was the secret signal?", [doc], PARAMS)
    assert [c["page"] for c in a.citations][0] == 3
    assert a.citations[0]["doc"] == doc and "three green lamps" in a.citations[0]["text"]
    b = answer(store, FakeBackend(model_file, answer="A storm closed the harbour for a week in autumn."),
               "How does the logbook end?", [doc], PARAMS)
    assert b.citations and b.citations[0]["page"] == 4     # no [p. N]: the best matching passage


def test_the_answer_is_stored_and_an_empty_question_or_no_document_is_refused(store, model_file):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    a = answer(store, FakeBackend(model_file, answer="Grain and timber."), "What did ships bring?", [doc], PARAMS)
    stored = store.answers(doc_id=doc)
    assert [(r["id"], r["question"], r["answer"]) for r in stored] == [(a.answer_id, "What did ships bring?",
                                                                        "Grain and timber.")]
    unsaved = answer(store, FakeBackend(model_file), "Again?", [doc], PARAMS, save=False)
    assert unsaved.answer_id is None and len(store.answers(doc_id=doc)) == 1
    with pytest.raises(AskError, match="the question is empty"):
        answer(store, FakeBackend(model_file), "   ", [doc], PARAMS)
    with pytest.raises(AskError, match="no documents to ask"):
        answer(store, FakeBackend(model_file), "Anything?", [], PARAMS)


def test_several_documents_on_a_composing_backend_are_read_side_by_side(store, model_file):
    log = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    minutes = add_document(store, "/docs/minutes.txt", "Council Minutes",
                           ["The council met on Tuesday.", "The budget is twelve million euros."])
    backend = FakeBackend(model_file, answer="Twelve million euros [p. 2].", composes=True)
    progress = []
    a = answer(store, backend, "What is the budget?", [log, minutes], PARAMS,
               Listeners(progress=lambda *report: progress.append(report)))
    prompt = backend.detokenize(backend.prompts[-1])
    assert prompt.count("=== Document:") == 2 and prompt.count("You are eLLM") == 1   # one header, two documents
    assert prompt.index("Harbour Log") < prompt.index("Council Minutes") < prompt.index("Question:")
    # the best passage again after both documents (copies of its cached blocks), just before the question
    budget = "The budget is twelve million euros."
    assert prompt.count(budget) == 2 and prompt.rindex(budget) > prompt.rindex("[Page 2]")
    assert [c["doc"] for c in a.considered] == [log, minutes] and a.note == ""
    # Each document read: 0 of its tokens, then as the prefill reports them, up to all of them.
    firsts = [line for done, total, line in progress if done == 0]
    assert [f.split(":")[0] for f in firsts] == ["reading Harbour Log (1 of 2)", "reading Council Minutes (2 of 2)"]
    assert [done == total for done, total, _ in progress] == [False, False, True] * 2
    assert all(f"of {total:,} tokens" in line for _, total, line in progress)
    assert a.citations[0] == {"doc": minutes, "page": 2, "text": "The budget is twelve million euros."}
    assert set(a.as_dict()) >= {"considered", "note"}
    # Asked again, both documents' caches come from their files: nothing is read.
    progress.clear()
    again = answer(store, backend, "Who met on Tuesday?", [log, minutes], PARAMS,
                   Listeners(progress=lambda *report: progress.append(report)))
    assert progress == [] and again.timings["kv_cache"] == "hit"


def test_over_the_memory_budget_only_the_most_relevant_documents_are_laid_side_by_side(store, model_file):
    log = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    minutes = add_document(store, "/docs/minutes.txt", "Council Minutes",
                           ["The council met on Tuesday.", "The budget is twelve million euros."])
    backend = FakeBackend(model_file, composes=True, kv_bytes=1000)
    a = answer(store, backend, "What is the council budget?", [log, minutes], PARAMS,
               options=AnswerOptions(memory_budget=100_000))
    assert [c["doc"] for c in a.considered] == [minutes] and a.doc_ids == [minutes]
    assert "most relevant" in a.note and "Council Minutes" in a.note and a.note in a.notes
    assert "Harbour Log" not in backend.detokenize(backend.prompts[-1])
    with pytest.raises(AskError, match="choose a smaller KV setting"):
        answer(store, backend, "What is the council budget?", [log, minutes], PARAMS,
               options=AnswerOptions(memory_budget=10))


def test_attended_blocks_are_mapped_to_the_page_and_passage_they_hold(store, model_file):
    log = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    minutes = add_document(store, "/docs/minutes.txt", "Council Minutes", ["The council met on Tuesday."])
    backend = FakeBackend(model_file, composes=True)
    answer(store, backend, "What was the secret signal?", [log, minutes], PARAMS)   # caches the prefixes
    prompt = backend.prompts[-1]
    text = backend.detokenize(prompt)
    start = len(backend.tokenize(text[:text.index("The secret signal")]))      # tokens before page 3's text
    backend.attended = [(start, start + 6, 0.75), (0, 4, 0.25)]               # page 3, and the system prompt
    a = answer(store, backend, "What was the secret signal?", [log, minutes], PARAMS)
    assert [(x["doc"], x["page"], x["weight"]) for x in a.attended] == [(log, 3, 1.0)]
    assert "three green lamps" in a.attended[0]["text"]


@pytest.mark.parametrize("several", [False, True])
def test_sparse_answers_also_read_the_passages_that_match_the_question_best(store, model_file, several):
    log = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    minutes = add_document(store, "/docs/minutes.txt", "Council Minutes",
                           ["The council met on Tuesday.", "The budget is twelve million euros."])
    docs = [minutes, log] if several else [log]
    backend = FakeBackend(model_file, composes=True, focus=True)
    answer(store, backend, "Which lamps were the secret signal?", docs, PARAMS)
    (before, ranges), = backend.focused               # told once, before the answer was generated
    assert before == 0 and ranges
    read = [backend.detokenize(backend.cache[s:e]).strip() for s, e in ranges]
    assert read[0] == PAGES[2]                        # the best match first, token for token
    assert all(text in PAGES + ["The budget is twelve million euros.", "The council met on Tuesday."]
               for text in read)
    # A backend that cannot be told (dense attention reads everything) is not.
    dense = FakeBackend(model_file, composes=True)
    dense.focus = None
    answer(store, dense, "Which lamps were the secret signal?", docs, PARAMS)


def test_the_focus_and_the_attended_passages_share_one_pass_over_the_tokens(store, model_file):
    """Both map between cached tokens and page bytes (qa/spans.py): the byte offsets of a prompt's
    tokens are worked out once per answer, not once for each."""
    log = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    minutes = add_document(store, "/docs/minutes.txt", "Council Minutes", ["The council met on Tuesday."])
    spelled = {}
    for focus in (False, True):
        backend = FakeBackend(model_file, composes=True, focus=focus)
        answer(store, backend, "What was the secret signal?", [log, minutes], PARAMS)   # caches the prefixes
        backend.attended = [(0, 4, 1.0)]
        calls, token_bytes = [], backend.token_bytes
        backend.token_bytes = lambda t: calls.append(t) or token_bytes(t)
        a = answer(store, backend, "What was the secret signal?", [log, minutes], PARAMS)
        assert a.attended == [] and bool(backend.focused and backend.focused[-1][1]) == focus
        spelled[focus] = len(calls)
    assert spelled[True] == spelled[False] > 0


def test_a_prefix_the_cache_holds_only_part_of_is_not_mapped(model_file):
    """A reading stopped half way leaves part of the prefix cached: its attended blocks (left from
    an earlier answer) map to no page rather than past the token offsets."""
    from app.qa.attended import attended_passages
    from app.qa.pages import ContextPlan, PageText
    from app.qa.spans import PromptLayout

    backend = FakeBackend(model_file, composes=True)
    text = "[Page 1]\nThe secret signal was three green lamps above the pier.\n"
    tokens = backend.tokenize(text)
    plan = ContextPlan(pages=[PageText(1, "Harbour Log", 1, text[9:], len(tokens))])
    backend.attended = [(8, 12, 1.0)]
    for held, laid in ((len(tokens), 1), (6, 0)):
        backend.cache = tokens[:held]
        layout = PromptLayout(backend, [(0, len(tokens), text, plan)])
        assert len(layout.documents) == laid
        assert [x["page"] for x in attended_passages(backend, layout)] == [1] * laid


def test_blank_lines_pad_the_pages_in_front_so_the_question_follows_the_last_page(store, model_file):
    """Block padding before the question measurably cost answers (qa/prompt.py): the header and
    the pages are whole blocks, the padding lies between them, the question follows the text."""
    from app.qa.prompt import build_prompt
    backend = FakeBackend(model_file, composes=True, block=16)
    p = build_prompt(backend, "What was the signal?", "[Page 1]\nThe signal was three green lamps.")
    assert len(p.header) % 16 == 0 and len(p.doc) % 16 == 0
    assert p.doc_text.startswith("\n") and p.doc_text.lstrip("\n") == "[Page 1]\nThe signal was three green lamps."
    assert backend.detokenize(p.doc) == p.doc_text
    assert backend.detokenize(p.tokens).endswith("green lamps.\n\nQuestion: What was the signal? </user>\n<assistant> ")


# ---- answers before a document is read, and the passages beside the question ---------------

def long_log() -> list[str]:
    """A document well past READ_AT_ONCE tokens, with one page that holds the answer."""
    filler = [f"Day {i}: the keeper wrote of nets, ropes, tides and gulls on an ordinary day at sea. " * 8
              for i in range(40)]
    return filler[:23] + ["The harbour master's secret password was BLUEHERON, kept in the brass box."] + filler[23:]


def test_a_document_not_read_yet_is_answered_at_once_from_its_best_passages_and_says_so(store, model_file):
    doc = add_document(store, "/docs/long.txt", "Long Log", long_log())
    backend = FakeBackend(model_file, composes=True, focus=True, n_ctx=16384)
    a = answer(store, backend, "What was the harbour master's secret password?", [doc], PARAMS)
    assert a.answered_from == "passages" and a.as_dict()["answered_from"] == "passages"
    prompt = backend.detokenize(backend.prompts[0])
    assert "[Page 24]\nThe harbour master's secret password was BLUEHERON" in prompt
    assert len(backend.prompts[0]) < 2048 < len(backend.tokenize("\n".join(long_log())))   # a short prompt
    assert prompt.index("[Page 24]") < prompt.index("Question:") and BESIDE_LEAD not in prompt
    assert "Answered from" in a.note and "Long Log is not read yet" in a.note and a.note in a.notes
    assert not a.plan.note and a.plan.truncated and not store.kv_caches(doc)     # nothing was read
    assert a.citations and a.citations[0]["page"] == 24
    # The whole document on request: read now (its cache file kept), the passages beside the question.
    whole = answer(store, backend, "What was the harbour master's secret password?", [doc], PARAMS,
                   options=AnswerOptions(source="document"))
    assert whole.answered_from == "document" and len(store.kv_caches(doc)) == 1
    prompt = backend.detokenize(backend.prompts[-1])
    assert prompt.count("BLUEHERON") == 2 and prompt.rindex("BLUEHERON") < prompt.index("Question:")
    # Read once, the next question sees the whole document by default.
    again = answer(store, backend, "Where was the password kept?", [doc], PARAMS)
    assert again.answered_from == "document" and again.timings["kv_cache"] == "hit"


def test_across_documents_some_not_read_the_read_ones_are_whole_and_the_others_give_passages(store, model_file):
    """A folder where one long document is read and another is not: the question reads the read
    one whole (its cache) and the best passages of the other beside the question, at once, and
    says which it read whole; one that no passage matches is left out."""
    from app.qa.doc_cache import DocCaches, store_cache_dir
    from app.qa.reading import read_document

    tides = [f"Tide table {i}: the harbour master's boat left with the tide at dawn, keeping the password "
             f"book aboard. " * 8 for i in range(30)]
    read = add_document(store, "/docs/tides.txt", "Tide Tables", tides)
    unread = add_document(store, "/docs/long.txt", "Long Log", long_log())
    unrelated = add_document(store, "/docs/recipes.txt", "Recipes", ["Bake the bread at dawn for an hour. " * 300])
    backend = FakeBackend(model_file, composes=True, n_ctx=16384)
    caches = DocCaches(store, store_cache_dir(store))
    assert read_document(store, backend, read, caches).status == "read"
    backend.cache = []                                   # a new process: the read one is in its file
    a = answer(store, backend, "What was the harbour master's secret password?", [read, unread, unrelated], PARAMS)
    assert a.answered_from == "document" and a.considered == [{"doc": read, "title": "Tide Tables"}]
    assert a.note.startswith("Read whole: Tide Tables; from the other 2, their best passages (Long Log; Recipes are "
                             "not read yet")
    prompt = backend.detokenize(backend.prompts[-1])
    assert prompt.count("Tide table 29") >= 1                                       # the whole read document
    assert "The harbour master's secret password was BLUEHERON" in prompt.split(BESIDE_LEAD)[-1]
    assert "Day 0:" not in prompt and "Bake the bread" not in prompt                 # passages, not whole
    assert a.timings["kv_cache"] == "hit" and not store.kv_caches(unread)            # nothing else was read
    assert unread in a.doc_ids and (unread, 24) in {(c["doc"], c["page"]) for c in a.citations}


@pytest.mark.parametrize("composes", [True, False])
def test_the_passages_beside_as_text_after_the_document(store, model_file, composes):
    """Asked for, or where the backend has no blocked cache to copy from."""
    doc = add_document(store, "/docs/long.txt", "Long Log", long_log())
    backend = FakeBackend(model_file, composes=composes, n_ctx=16384)
    options = AnswerOptions(source="document", beside="text" if composes else "blocks")
    answer(store, backend, "What was the secret password?", [doc], PARAMS, options=options)
    prompt, beside = backend.detokenize(backend.prompts[-1]).split(BESIDE_LEAD)
    assert "[Page 24]\nThe harbour master's secret password was BLUEHERON" in beside
    assert beside.index("BLUEHERON") < beside.index("Question:") and "[Page 24]" in prompt


def test_without_the_passages_beside_a_read_document_ends_with_the_question(store, model_file):
    doc = add_document(store, "/docs/long.txt", "Long Log", long_log())
    backend = FakeBackend(model_file, composes=True, n_ctx=16384)
    a = answer(store, backend, "What was the secret password?", [doc], PARAMS,
               options=AnswerOptions(source="document", beside="none"))
    prompt = backend.detokenize(backend.prompts[-1])
    assert a.answered_from == "document" and BESIDE_LEAD not in prompt and prompt.count("[Page 24]") == 1


def test_the_passages_alone_are_copies_read_with_the_prompts_header_only(store, model_file):
    """beside="alone": the same copies of the best passages' blocks as "blocks", and the backend
    is told the header's length (what the answer reads besides them); by default it is not."""
    doc = add_document(store, "/docs/long.txt", "Long Log", long_log())
    heads = {}
    for mode in ("blocks", "alone"):
        backend = FakeBackend(model_file, composes=True, n_ctx=16384)
        answer(store, backend, "What was the secret password?", [doc], PARAMS,
               options=AnswerOptions(source="document", beside=mode))
        prompt = backend.detokenize(backend.prompts[-1])
        assert prompt.count("secret password was BLUEHERON") == 2 and BESIDE_LEAD not in prompt
        heads[mode] = backend.views[-1]
    header = build_prompt(backend, "?", "").header
    assert heads == {"blocks": None, "alone": len(header)}
    text_only = FakeBackend(model_file, composes=False, n_ctx=16384)    # nothing to copy: the passages as text
    answer(store, text_only, "What was the secret password?", [doc], PARAMS,
           options=AnswerOptions(source="document", beside="alone"))
    assert BESIDE_LEAD in text_only.detokenize(text_only.prompts[-1]) and text_only.views == []


def test_the_passages_beside_take_only_the_room_the_context_leaves(store, model_file):
    doc = add_document(store, "/docs/long.txt", "Long Log", long_log())
    whole = len(FakeBackend(model_file).tokenize("\n".join(long_log())))
    backend = FakeBackend(model_file, composes=True, n_ctx=whole + 400)
    answer(store, backend, "What was the secret password?", [doc], PARAMS, options=AnswerOptions(source="document"))
    assert len(backend.prompts[-1]) + PARAMS.max_tokens <= backend.n_ctx


def test_a_small_document_is_read_for_its_first_question(store, model_file):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    backend = FakeBackend(model_file, composes=True)
    a = answer(store, backend, "What was the secret signal?", [doc], PARAMS)
    assert a.answered_from == "document" and len(store.kv_caches(doc)) == 1


def test_a_question_no_passage_matches_and_a_document_without_text_are_clear_errors(store, model_file):
    doc = add_document(store, "/docs/long.txt", "Long Log", long_log())
    backend = FakeBackend(model_file, composes=True, n_ctx=16384)
    with pytest.raises(AskError, match="no passage of the documents shares a word with the question"):
        answer(store, backend, "Qwertyuiop zxcvbnm?", [doc], PARAMS)
    empty = store.save_document({"path": "/docs/scan.pdf", "title": "Scan", "status": "ingested", "pages": 0}, [], [])
    with pytest.raises(AskError, match="has no text in the store"):
        answer(store, backend, "What is in it?", [empty], PARAMS, options=AnswerOptions(source="passages"))
    assert store.answers() == []                     # nothing stored half-done
    with pytest.raises(ValueError, match="source must be one of auto, document, passages"):
        AnswerOptions(source="everything")


def test_a_long_answer_never_turns_a_whole_document_that_fits_into_a_selection(store, model_file):
    """A document that fits the context with a short answer stays whole, whatever the answer
    length asked: the answer gets what the context leaves (reading a selection of its pages would
    be another prefix to read, replacing the document's cache file)."""
    doc = add_document(store, "/docs/long.txt", "Long Log", long_log())
    whole = len(FakeBackend(model_file).tokenize("\n".join(long_log())))
    backend = FakeBackend(model_file, composes=True, n_ctx=whole + 800)     # the pages, their markers, 300 to spare
    for max_tokens in (16, 2000):
        a = answer(store, backend, "What was the secret password?", [doc], SamplingParams.make_greedy(max_tokens),
                   options=AnswerOptions(source="document"))
        assert not a.plan.truncated and len(a.plan.pages) == 41
    assert len(store.kv_caches(doc)) == 1 and a.timings["kv_cache"] == "hit"


def test_where_nothing_read_stays_read_every_question_reads_its_documents(store, model_file):
    """llama.cpp and Gemma 3's contiguous cache keep no prefix files: the automatic source answers from
    the whole document there, as before, rather than from passages for ever."""
    doc = add_document(store, "/docs/long.txt", "Long Log", long_log())
    a = answer(store, FakeBackend(model_file, n_ctx=16384), "What was the secret password?", [doc], PARAMS)
    assert a.answered_from == "document" and not a.plan.truncated


def test_passages_of_one_page_keep_the_order_they_stand_in(store, model_file):
    from app.qa.pages import token_counter
    from app.qa.retrieval import best_passages, passage_pages

    text = "Harbour rules. " * 30 + "The password is BLUEHERON. " + "Gulls and tides. " * 40
    doc = store.save_document({"path": "/docs/rules.txt", "title": "Rules", "status": "ingested", "pages": 1},
                              [(1, 0, text)], [(1, 0, 450, text[:450]), (1, 450, len(text), text[450:])])
    found = best_passages(store, [doc], "password BLUEHERON gulls harbour", 2)
    assert [p.start for p in found] == [450, 0]                                   # the later chunk ranks first
    [page] = passage_pages(found, token_counter(FakeBackend(model_file)))
    assert page.text.index("Harbour rules.") < page.text.index("BLUEHERON")
