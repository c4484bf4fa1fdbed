"""``ellm batch``: many documents, many questions, on Ray workers, resumable, results in the
store and in a CSV, JSON Lines or Markdown file. The work is app/batch's; this module reads
the options, sizes the workers and shows the progress."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from app.cli.context import ask_target
from app.cli.context import CliError, Context, err


def batch_target(ctx: Context) -> tuple[str, tuple[int, ...]]:
    """(the target as the batch's key names it, its document ids), by the resolver `ellm ask` uses."""
    a = ctx.args
    target = ask_target(ctx)
    if a.doc:
        name = "docs:" + ",".join(str(i) for i in sorted(set(target.doc_ids)))
    elif a.folder:
        name = f"folder:{target.folder}"
    else:
        name = "all"
    return name, tuple(dict.fromkeys(target.doc_ids))


def cmd_batch(ctx: Context) -> int:
    from app.batch.driver import run_batch, session_spec
    from app.batch.results_file import BatchExportError, export_rows, format_for, write_results
    from app.batch.pools import size_workers
    from app.batch.ray_pool import AUTH_HINT, RayPool
    from app.batch.spec import read_questions, tasks_from
    from app.batch.worker import WorkerError
    from app.runtime.engines import thread_plan
    from app.store import batches

    a = ctx.args
    try:
        fmt = format_for(a.out)
    except BatchExportError as e:
        raise CliError(str(e)) from e
    if a.questions:
        try:
            questions = read_questions(a.questions)
        except OSError as e:
            raise CliError(f"{a.questions}: cannot read the questions file ({e.strerror or e})") from e
        if not questions:
            raise CliError(f"{a.questions}: no questions in it (one a line; # starts a comment)")
    else:
        questions = list(a.ask or [])
    tasks = tasks_from(questions, a.summarize)
    if not tasks:
        raise CliError("nothing to ask: give --ask QUESTION, --questions FILE or --summarize")
    target, doc_ids = batch_target(ctx)
    s = ctx.session.settings
    model_path = ctx.model_path
    note = ctx.session.engine_note()
    if note:
        err(f"ellm: {note}")
    try:
        workers, threads = size_workers(a.workers, s.threads, thread_plan(0, s.numa).count, bool(a.ray_address))
    except ValueError as e:
        raise CliError(f"--workers/--threads: {e}") from e
    spec = session_spec(ctx.session, target, doc_ids, tasks, ctx.sampling(greedy=a.greedy, max_tokens=a.max_tokens),
                        threads)
    if not ctx.json or a.verbose:
        err(f"batch {spec.batch_id}: {len(doc_ids)} documents x {len(tasks)} tasks, model {model_path.name}, "
            f"{'Ray at ' + a.ray_address if a.ray_address else 'local Ray'}, "
            f"{workers or 'cluster-sized'} workers x {threads} threads")
    # Ray prints its own notes (a task retried, a worker restarted) on stdout: they go to stderr,
    # so that stdout holds the result alone (--json).
    with contextlib.redirect_stdout(sys.stderr):
        try:
            pool = RayPool(spec.engine, workers, threads, a.ray_address, verbose=a.verbose)
        except WorkerError as e:
            raise CliError(str(e)) from e
        except ConnectionError as e:
            raise CliError(f"cannot reach the Ray cluster at {a.ray_address}: {e} ({AUTH_HINT})") from e
        err("workers: " + ", ".join(pool.names))
        try:
            report = run_batch(ctx.store, spec, pool, on_progress=lambda p: err(p.line()))
        finally:
            pool.close()
    out = write_results(Path(a.out), export_rows(batches.results(ctx.store, spec.batch_id)))
    summary = {**report.as_dict(), "tasks": len(tasks), "model": model_path.name, "workers": pool.workers,
               "threads": threads, "out": str(out), "format": fmt}
    if ctx.json:
        ctx.print_json(summary)
    else:
        print(f"batch {report.batch_id}: {report.done} of {report.total} documents done ({report.skipped} "
              f"before this run), {report.answers} answers written, {len(report.failures)} failed; "
              f"results in {out} ({fmt})")
        for f in report.failures:
            print(f"  failed: {f['title'] or f['doc']}: {f['reason']}")
    return 0 if report.complete else 1
