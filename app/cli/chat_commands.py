"""Conversations and the local API on the command line: chat, threads, serve, and the thread
part of ``ask --thread``. Each takes the invocation's Context and returns the exit status."""
from __future__ import annotations

import logging
import sys

from app.cli.context import CliError, Context, ProgressLine, ask_target, err

QUIT = ("/quit", "/exit")
NEW = "/new"


def thread_of(ctx: Context, thread_id: int) -> dict:
    from app.store.threads import get_thread

    thread = get_thread(ctx.store, thread_id)
    if thread is None:
        raise CliError(f"no thread {thread_id}; `ellm threads` lists them")
    missing = [d for d in thread["doc_ids"] if ctx.store.document(d) is None]
    if missing:
        raise CliError(f"thread {thread_id} is about documents that are no longer in the library ({missing}); "
                       f"start a new one")
    return thread


def conversation_for(ctx: Context) -> tuple:
    """(the target of --doc/--folder/--all or None, the Conversation to continue, its document
    ids): the thread of --thread, or a new one about the target (created with its first answer)."""
    from app.qa.conversation import Conversation
    from app.store.threads import thread_turns

    a = ctx.args
    if a.thread is None:
        target = ask_target(ctx)
        return target, Conversation(None), list(target.doc_ids)
    if a.doc or a.folder or a.all:
        raise CliError("--thread continues that thread's documents: leave out --doc, --folder and --all")
    thread = thread_of(ctx, a.thread)
    return None, Conversation.from_rows(thread["id"], thread_turns(ctx.store, thread["id"])), list(thread["doc_ids"])


def new_thread(ctx: Context, conversation, doc_ids: list[int], question: str, target) -> None:
    """Give ``conversation`` its thread in the store before its first answer is saved (about
    ``target``'s kind and folder; a thread continued with --thread has its own)."""
    from app.store.threads import create_thread

    if conversation.thread_id is None:
        kind = getattr(target, "kind", "selected")
        conversation.thread_id = create_thread(ctx.store, doc_ids, question, kind=kind,
                                               folder=getattr(target, "folder", None))


def show_sources(ctx: Context, result) -> None:
    """The notes, sources and attended passages of an answer, after its streamed text."""
    from app.qa.answer import FROM_PASSAGES

    print()
    for note in (result.plan.note, result.note, result.turns_note):
        if note:
            print(f"\nNote: {note}")
    if result.answered_from == FROM_PASSAGES:
        print("(`ellm read` reads the documents for the next questions; `ellm ask --whole` waits for the reading)")
    titles = {d["id"]: d["title"] for d in ctx.store.documents()}
    if result.citations:
        print("\nSources:")
        for c in result.citations:
            print(f"  - {titles.get(c['doc'], c['doc'])}, p. {c['page']}: \"{c['text'][:160]}\"")
    if result.attended:
        print("\nAttended (where the model looked while answering): " + ", ".join(
            f"{titles.get(x['doc'], x['doc'])} p. {x['page']} ({x['weight']:.0%})" for x in result.attended))
    t = result.timings
    print(f"\n[{t['prompt_tokens']} prompt tokens ({t.get('reused_prompt_tokens', 0)} cached), first token after "
          f"{t['ttft_s']:.2f} s, {t['decode_tok_s']:.1f} tokens/s, engine {result.engine}"
          + (f", thread {result.thread_id}" if result.thread_id else "") + "]")


def cmd_chat(ctx: Context) -> int:
    """A line-editing prompt: each question a turn of one thread, answers streamed with their pages."""
    from app.qa.answer import AskError
    from app.qa.conversation import Conversation
    from app.qa.stream import Listeners
    from app.session import SessionError

    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    a = ctx.args
    target, conversation, doc_ids = conversation_for(ctx)
    backend = ctx.noted(ctx.session.question_backend(doc_ids))     # loaded before the first question, kept for all
    titles = [(ctx.store.document(d) or {}).get("title", str(d)) for d in doc_ids]
    err(f"Chatting about {'; '.join(titles[:3])}{f' and {len(titles) - 3} more' if len(titles) > 3 else ''}"
        + (f" (thread {conversation.thread_id}, {len(conversation.turns)} turns so far)" if conversation.thread_id
           else "") + f". {NEW} starts a new conversation, {QUIT[0]} or Ctrl-D ends.")

    def show(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    while True:
        try:
            question = input("\nyou> ").strip()
        except EOFError:
            print()
            return 0
        if not question:
            continue
        if question in QUIT:
            return 0
        if question == NEW:
            conversation = Conversation(None)
            err("(a new conversation)")
            continue
        new_thread(ctx, conversation, doc_ids, question, target)
        print("\neLLM> ", end="", flush=True)
        try:
            result = ctx.session.ask(question, doc_ids, greedy=a.greedy, max_tokens=a.max_tokens, backend=backend,
                                     listen=Listeners(on_text=show, progress=ProgressLine("chat")),
                                     conversation=conversation)
        except (AskError, SessionError, ValueError, KeyboardInterrupt) as e:
            err(f"ellm: {e}" if not isinstance(e, KeyboardInterrupt) else "\n(stopped)")
            forget_if_empty(ctx, conversation)
            continue
        show_sources(ctx, result)


def forget_if_empty(ctx: Context, conversation) -> None:
    """A thread whose first question failed keeps no turn: it is deleted, the next question starts it."""
    from app.store.threads import delete_thread, get_thread

    thread = get_thread(ctx.store, conversation.thread_id) if conversation.thread_id is not None else None
    if thread is not None and not thread["turns"]:
        delete_thread(ctx.store, thread["id"])
        conversation.thread_id = None


def thread_row(t: dict) -> dict:
    return {"id": t["id"], "title": t["title"], "kind": t["kind"], "documents": t["doc_ids"], "folder": t["folder"],
            "turns": t["turns"], "created_at": t["created_at"], "updated_at": t["updated_at"]}


def cmd_threads(ctx: Context) -> int:
    """List, search, show or delete conversations."""
    from app.store.threads import delete_thread, get_thread, list_threads, rename_thread, thread_turns

    a = ctx.args
    if a.delete is not None:
        if not delete_thread(ctx.store, a.delete):
            raise CliError(f"no thread {a.delete}; `ellm threads` lists them")
        if ctx.json:
            ctx.print_json({"deleted": a.delete})
        else:
            print(f"Deleted thread {a.delete}.")
        return 0
    if a.rename is not None:
        thread_id, title = a.rename
        if not thread_id.isdigit() or get_thread(ctx.store, int(thread_id)) is None:
            raise CliError(f"no thread {thread_id}; `ellm threads` lists them")
        try:
            rename_thread(ctx.store, int(thread_id), title)
        except ValueError as e:
            raise CliError(str(e)) from e
        a.show = int(thread_id)
    if a.show is not None:
        thread = get_thread(ctx.store, a.show)
        if thread is None:
            raise CliError(f"no thread {a.show}; `ellm threads` lists them")
        turns = [{"question": r["question"], "answer": r["answer"], "citations": r["citations"] or [],
                  "created_at": r["created_at"], "answer_id": r["id"]} for r in thread_turns(ctx.store, a.show)]
        if ctx.json:
            ctx.print_json({**thread_row(thread), "turns": turns})
            return 0
        print(f"Thread {thread['id']}: {thread['title']}")
        for t in turns:
            pages = ", ".join(f"p. {c['page']}" for c in t["citations"][:6])
            print(f"\nyou> {t['question']}\neLLM> {t['answer']}" + (f"\n  ({pages})" if pages else ""))
        return 0
    threads = [thread_row(t) for t in list_threads(ctx.store, search=a.search or "")]
    if ctx.json:
        ctx.print_json(threads)
        return 0
    if not threads:
        print("No conversations yet: `ellm chat --doc DOC` or `ellm ask ... ` starts one."
              if not a.search else f"No conversation matches '{a.search}'.")
        return 0
    print(f"{'id':>4}  {'turns':>5}  {'updated':<16}  title")
    for t in threads:
        print(f"{t['id']:>4}  {t['turns']:>5}  {t['updated_at'][:16].replace('T', ' '):<16}  {t['title']}")
    return 0


def cmd_serve(ctx: Context) -> int:
    """The OpenAI-compatible API until Ctrl-C (app/api/server.py)."""
    from app.api.server import ApiServer, ApiServerError

    a = ctx.args
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("ellm.api").setLevel(logging.INFO)
    try:
        server = ApiServer(ctx.session, a.host, a.port, api_key=a.api_key, cors=a.cors or ())
        ctx.session.store      # the store opens (and upgrades) before the first request
        server.run(announce=lambda url: err(f"ellm: serving the OpenAI-compatible API on {url}/v1 "
                                              f"(Ctrl-C stops){'; every request needs the API key' if a.api_key else ''}"))
    except ApiServerError as e:
        raise CliError(str(e)) from e
    return 0
