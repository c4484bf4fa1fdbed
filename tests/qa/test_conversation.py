"""Conversations (qa/conversation.py, store/threads.py) without a model: a follow-up sees the
earlier turns after the document, continues what the backend holds (prefilling only itself),
is rebuilt from the store after a restart, leaves the oldest turns out when they no longer fit,
and is saved to its thread. The backend is tests/qa/fake_backend.py."""
from __future__ import annotations

from app.engine.backend import SamplingParams
from app.qa.answer import answer
from app.qa.conversation import Conversation, next_turn
from app.qa.doc_cache import DocCaches, store_cache_dir
from app.store.threads import create_thread, delete_thread, get_thread, list_threads, thread_turns
from tests.qa.fake_backend import FakeBackend
from tests.qa.test_answer_service import PAGES, add_document

PARAMS = SamplingParams.make_greedy(16)


class Counting(FakeBackend):
    """Counts the prefixes it is asked to make: a continued conversation asks for none."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.prefixes = 0

    def ensure_prefix(self, tokens, file=None, cancel=None, progress=None):
        self.prefixes += 1
        return super().ensure_prefix(tokens, file, cancel, progress)


def _ask(store, backend, question, doc, conv, **kw):
    return answer(store, backend, question, [doc], PARAMS, conversation=conv,
                  caches=DocCaches(store, store_cache_dir(store)), **kw)


def test_a_follow_up_sees_the_earlier_turn_and_prefills_only_itself(store, model_file):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    backend = Counting(model_file, composes=True, answer="Three green lamps [p. 3].")
    thread = create_thread(store, [doc])
    conv = Conversation(thread)
    first = _ask(store, backend, "What was the secret signal?", doc, conv)
    assert backend.prefixes == 1 and first.thread_id == thread and first.turns_left_out == 0
    backend.answer = "Above the pier [p. 3]."
    second = _ask(store, backend, "And where were they?", doc, conv)
    p1, p2 = backend.prompts
    answer_ids = backend.tokenize("Three green lamps [p. 3].")
    # the second prompt is the first, its answer as generated, the end of that turn and the new question
    assert p2 == p1 + answer_ids + next_turn(backend, "And where were they?")
    text = backend.detokenize(p2)
    assert text.index("[Page 3]") < text.index("What was the secret signal?") < text.index("Three green lamps") \
        < text.index("And where were they?")
    assert backend.prefixes == 1                      # the document's prefix was not prepared again
    assert backend.questions_at == [len(p1) + len(answer_ids)]   # only the new turn chooses what the answer reads
    assert second.timings["reused_prompt_tokens"] == len(p1) + len(answer_ids) - 0
    assert second.timings["prompt_tokens"] - second.timings["reused_prompt_tokens"] == len(
        next_turn(backend, "And where were they?"))
    turns = thread_turns(store, thread)
    assert [t["question"] for t in turns] == ["What was the secret signal?", "And where were they?"]
    assert [t["id"] for t in turns] == [first.answer_id, second.answer_id]
    assert get_thread(store, thread)["title"] == "What was the secret signal?"
    assert second.as_dict()["thread"] == thread


def test_after_a_restart_the_thread_is_rebuilt_from_the_store_and_the_prefix_from_its_file(store, model_file):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    backend = Counting(model_file, composes=True, answer="Three green lamps [p. 3].")
    thread = create_thread(store, [doc])
    _ask(store, backend, "What was the secret signal?", doc, Conversation(thread))
    held = backend.prompts[0] + backend.tokenize("Three green lamps [p. 3].")
    restarted = Counting(model_file, composes=True, answer="Above the pier.")   # nothing in memory
    restarted.tokenize("What was the secret signal?")    # same vocabulary order as the first process
    restarted._vocab, restarted._pieces = dict(backend._vocab), list(backend._pieces)
    conv = Conversation.from_rows(thread, thread_turns(store, thread))
    a = _ask(store, restarted, "And where were they?", doc, conv)
    prompt = restarted.prompts[0]
    assert prompt == held + next_turn(restarted, "And where were they?")
    assert a.timings["kv_cache"] == "hit"              # the document came back from its cache file
    assert len(thread_turns(store, thread)) == 2


def test_the_oldest_turns_are_left_out_when_they_no_longer_fit_and_the_answer_says_so(store, model_file):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    long_answer = "The harbour kept many records of ships and storms and lamps. " * 6
    backend = FakeBackend(model_file, n_ctx=240, answer=long_answer)
    conv = Conversation(create_thread(store, [doc]))
    results = [_ask(store, backend, q, doc, conv) for q in
               ("What was the secret signal?", "When does the logbook open?", "What closed the harbour?")]
    assert results[0].turns_left_out == 0
    last = results[-1]
    assert last.turns_left_out >= 1 and "left out" in last.notes
    prompt = backend.detokenize(backend.prompts[-1])
    assert "What closed the harbour?" in prompt and "What was the secret signal?" not in prompt
    assert len(backend.prompts[-1]) + PARAMS.max_tokens <= backend.n_ctx


def test_a_follow_up_about_an_unread_document_finds_passages_with_the_earlier_question(store, model_file):
    filler = [f"Page {i} tells of nets, ropes, tides and gulls on an ordinary day at sea. " * 30 for i in range(12)]
    pages = filler[:6] + ["On Windows the logbook program is installed from the harbour office installer."] + filler[6:]
    doc = add_document(store, "/docs/long.txt", "Long Log", pages)
    backend = FakeBackend(model_file, n_ctx=16384, composes=True, answer="From the installer [p. 7].")
    conv = Conversation(create_thread(store, [doc]))
    first = _ask(store, backend, "How is the logbook program installed?", doc, conv)
    assert first.answered_from == "passages"
    second = _ask(store, backend, "Where would one get that?", doc, conv)   # no word of the document
    assert second.answered_from == "passages" and "harbour office installer" in backend.detokenize(backend.prompts[-1])
    assert "How is the logbook program installed?" in backend.detokenize(backend.prompts[-1])


def test_threads_are_listed_searched_renamed_and_deleted_with_their_turns(store, model_file):
    from app.store.threads import rename_thread

    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    backend = FakeBackend(model_file, answer="Three green lamps [p. 3].")
    single = answer(store, backend, "What was the secret signal?", [doc], PARAMS)   # no thread: one of its own
    assert list_threads(store)[0]["id"] == thread_turns(store, list_threads(store)[0]["id"])[0]["thread_id"]
    thread = create_thread(store, [doc], kind="folder", folder="/docs")
    answer(store, backend, "When does the logbook open?", [doc], PARAMS, conversation=Conversation(thread))
    assert [t["id"] for t in list_threads(store)][0] == thread
    assert [t["turns"] for t in list_threads(store)] == [1, 1]
    assert [t["id"] for t in list_threads(store, search="logbook open")] == [thread]
    assert [t["id"] for t in list_threads(store, search="lamps")] != []        # the answers are searched too
    rename_thread(store, thread, "  Opening   of the log ")
    assert get_thread(store, thread)["title"] == "Opening of the log"
    assert delete_thread(store, thread) and get_thread(store, thread) is None
    assert [a["id"] for a in store.answers()] == [single.answer_id]
    assert not delete_thread(store, thread)
