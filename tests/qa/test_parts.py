"""A question that asks several things (qa/parts.py): where it is split, and how the answer
service asks the parts as turns of one conversation. The backend is tests/qa/fake_backend.py."""
from __future__ import annotations

import pytest

from app.engine.backend import SamplingParams
from app.qa.answer import PART_BREAK, AnswerOptions, answer
from app.qa.conversation import Conversation, next_turn
from app.qa.parts import question_parts
from app.qa.prompt import question_suffix
from app.qa.stream import Listeners
from app.store.threads import create_thread, thread_turns
from tests.qa.fake_backend import FakeBackend
from tests.qa.test_answer_service import PAGES, add_document

PARAMS = SamplingParams.make_greedy(16)
TWO = "What was the secret signal of the harbour, and which season does the logbook end in?"
SIGNAL, SEASON = "Three green lamps [p. 3].", "Autumn [p. 4]."
PARTS = AnswerOptions(parts=True)


class Scripted(FakeBackend):
    """Answers each prompt with the next of ``answers`` (the last one again when they run out)."""

    def __init__(self, *a, answers=(SIGNAL, SEASON), **kw):
        super().__init__(*a, answer=answers[0], **kw)
        self.answers = list(answers)

    def generate(self, prompt, params, cancel=None):
        self.answer = self.answers[min(len(self.prompts), len(self.answers) - 1)]
        return super().generate(prompt, params, cancel)


@pytest.mark.parametrize("question, parts", [
    (TWO, ["What was the secret signal of the harbour?", "And which season does the logbook end in?"]),
    ("Under FHS 3.0, what is the path of the crond PID file, and what lock file is created for ttyS0?",
     ["Under FHS 3.0, what is the path of the crond PID file?", "And what lock file is created for ttyS0?"]),
    ("Which options() setting may need to be increased,   and into which file is ls.1 formatted?",
     ["Which options() setting may need to be increased?", "And into which file is ls.1 formatted?"]),
    ("What is the Front-Cover Text, and at most how many words may a Back-Cover Text have",
     ["What is the Front-Cover Text?", "And at most how many words may a Back-Cover Text have?"]),
    ("Which port does it use, and which user runs it, and where are its logs kept?",
     ["Which port does it use?", "And which user runs it?", "And where are its logs kept?"]),
    ("What is the PID file's path? What lock file is created for ttyS0?",
     ["What is the PID file's path?", "And what lock file is created for ttyS0?"]),
    ("Is there a graphical installer; and which toolkit does it use?",
     ["Is there a graphical installer?", "And which toolkit does it use?"]),
    ("SQL92 is which ISO/IEC standard number, and which RODBC function removes a table?",
     ["SQL92 is which ISO/IEC standard number?", "And which RODBC function removes a table?"]),
])
def test_a_question_that_asks_several_things_is_split_at_and_before_a_question_word(question, parts):
    assert question_parts(question) == parts


@pytest.mark.parametrize("question", [
    "Which compilers and libraries does R need to build from source?",   # one question about two things
    "How many pages does it have, and is it long?",                      # no question word after "and"
    "Ships came in with grain, and which ones?",                         # too short to stand alone
    "The keeper wrote every evening, and which lamps did he light?",     # the first part asks nothing
    "Which port, and which user, and which group, and where are its logs kept?",   # a list
    "The config file is /etc/foo.conf, and which option sets the port?",          # a statement first
    'What does "cut, and which fields" mean in the example?',                     # a quotation
    "What was the secret   signal?\n",                                            # kept as asked
])
def test_a_question_that_asks_one_thing_stays_whole(question):
    assert question_parts(question) == [question]


def test_the_parts_are_asked_as_turns_each_continuing_the_last(store, model_file):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    backend = Scripted(model_file, composes=True, focus=True)
    streamed = []
    a = answer(store, backend, TWO, [doc], PARAMS, Listeners(on_text=streamed.append), options=PARTS)
    first, second = question_parts(TWO)
    p1, p2 = backend.prompts
    ids = backend.tokenize(SIGNAL)
    assert p1[-len(question_suffix(backend, first)):] == question_suffix(backend, first)
    assert TWO not in backend.detokenize(p1)
    assert p2 == p1 + ids + next_turn(backend, second)          # the second part continues what is held
    assert backend.questions_at == [len(p1) + len(ids)]          # and alone chooses what decoding reads
    assert a.answer == SIGNAL + PART_BREAK + SEASON == "".join(streamed).strip()
    assert a.question == TWO and store.answers()[0]["question"] == TWO
    assert [c["page"] for c in a.citations][:2] == [3, 4]


def test_each_part_brings_its_own_focus_passages(store, model_file):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    backend = Scripted(model_file, composes=True, focus=True)
    answer(store, backend, TWO, [doc], PARAMS, options=PARTS)
    first, second = question_parts(TWO)
    assert [n for n, _ in backend.focused] == [0, 1]            # set before each turn
    one = Scripted(model_file, composes=True, focus=True)
    answer(store, one, first, [doc], PARAMS, save=False, options=PARTS)
    assert backend.focused[0][1] == one.focused[0][1]           # the first turn: the first part's
    other = Scripted(model_file, composes=True, focus=True)
    answer(store, other, f"{first} {second}", [doc], PARAMS, save=False)
    assert backend.focused[1][1] == other.focused[0][1]         # the second: with the part before it


def test_by_default_the_question_is_asked_in_one_turn(store, model_file):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    backend = Scripted(model_file)
    a = answer(store, backend, TWO, [doc], PARAMS)
    assert len(backend.prompts) == 1 and TWO in backend.detokenize(backend.prompts[0])
    assert a.answer == SIGNAL


def test_in_a_conversation_the_question_is_one_turn_and_a_follow_up_continues_after_it(store, model_file):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    backend = Scripted(model_file, composes=True, answers=(SIGNAL, SEASON, "Above the pier."))
    thread = create_thread(store, [doc])
    conv = Conversation(thread)
    answer(store, backend, TWO, [doc], PARAMS, conversation=conv, options=PARTS)
    assert [(t.question, t.answer, t.tokens) for t in conv.turns] == [(TWO, SIGNAL + PART_BREAK + SEASON, None)]
    assert [t["question"] for t in thread_turns(store, thread)] == [TWO]
    held = backend.prompts[1] + backend.tokenize(SEASON)
    assert conv.held == held
    answer(store, backend, "Where were they?", [doc], PARAMS, conversation=conv)
    assert backend.prompts[2] == held + next_turn(backend, "Where were they?")


def test_a_follow_up_that_cannot_continue_sees_every_part_of_the_answer(store, model_file):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    backend = Scripted(model_file, composes=True, answers=(SIGNAL, SEASON, "Above the pier."))
    conv = Conversation(create_thread(store, [doc]))
    answer(store, backend, TWO, [doc], PARAMS, conversation=conv, options=PARTS)
    backend.cache = []                     # the backend no longer holds the documents' part
    answer(store, backend, "Where were they?", [doc], PARAMS, conversation=conv)
    text = backend.detokenize(backend.prompts[2])
    assert text.index(TWO) < text.index(SIGNAL) < text.index(SEASON) < text.index("Where were they?")


def test_where_the_later_parts_would_not_fit_the_question_is_asked_in_one_turn(store, model_file):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    alone = AnswerOptions(beside="none", parts=True)      # nothing beside: the first prompt alike at any context
    params = SamplingParams.make_greedy(64)
    probe = Scripted(model_file)
    answer(store, probe, TWO, [doc], params, save=False, options=alone)
    first, second = question_parts(TWO)
    whole = Scripted(model_file)
    answer(store, whole, TWO, [doc], params, save=False, options=AnswerOptions(beside="none"))
    needed = len(whole.prompts[0]) + 2 * params.max_tokens + len(next_turn(probe, second))   # parts_that_fit's sum
    exact = Scripted(model_file, n_ctx=needed)
    answer(store, exact, TWO, [doc], params, save=False, options=alone)
    assert len(exact.prompts) == 2                              # room for both turns: asked in parts
    tight = Scripted(model_file, n_ctx=needed - 1)
    a = answer(store, tight, TWO, [doc], params, save=False, options=alone)
    assert len(tight.prompts) == 1 and TWO in tight.detokenize(tight.prompts[0])   # not half the question
    assert a.answer == SIGNAL


def test_no_break_is_streamed_before_an_answer_that_says_nothing(store, model_file):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    streamed = []
    a = answer(store, Scripted(model_file, answers=("", SEASON)), TWO, [doc], PARAMS,
               Listeners(on_text=streamed.append), options=PARTS)
    assert a.answer == SEASON == "".join(streamed).strip() and PART_BREAK not in "".join(streamed)
