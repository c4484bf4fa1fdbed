"""``ellm batch``: many documents, many questions, on Ray workers, resumable, results in the
store and in a CSV, JSON Lines or Markdown file. The work is app/batch's; this module reads
the options, sizes the workers and shows the progress."""
from __future__ import annotations

from pathlib import Path

from app.cli.commands import ask_target
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


def size_workers(workers: int | None, threads: int, cores: int, cluster: bool) -> tuple[int, int]:
    """(workers, threads per worker) so that workers x threads <= the cores of this machine
    (on a cluster: threads fit the cores here, workers default to the cluster's CPUs / threads,
    0 meaning "ask the cluster")."""
    if workers is not None and workers < 1:
        raise CliError(f"--workers must be 1 or more, not {workers}")
    if threads < 0:
        raise CliError(f"--threads must be 0 (one per physical core) or more, not {threads}")
    if workers is None:
        threads = threads or cores
        return (0 if cluster else max(1, cores // threads)), threads
    threads = threads or max(1, cores // workers)
    if not cluster and workers * threads > cores:
        raise CliError(f"{workers} workers x {threads} threads is more than the {cores} physical cores of this "
                       f"machine; lower --workers or --threads")
    return workers, threads


def cmd_batch(ctx: Context) -> int:
    from app.batch.driver import run_batch
    from app.batch.export import BatchExportError, export_rows, format_for, write_results
    from app.batch.ray_pool import RayPool
    from app.batch.spec import BatchSpec, EngineSpec, read_questions, tasks_from
    from app.batch.worker import WorkerError
    from app.qa.doc_cache import model_fingerprint
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
    cores = thread_plan(0, s.numa).count
    workers, threads = size_workers(a.workers, s.threads, cores, bool(a.ray_address))
    engine = EngineSpec(s.engine, str(model_path), model_path.name, s.n_ctx, threads, s.numa, s.kv, s.attention)
    spec = BatchSpec(target, doc_ids, tasks, engine, ctx.sampling(greedy=a.greedy, max_tokens=a.max_tokens),
                     model_fingerprint(model_path))
    if not ctx.json or a.verbose:
        err(f"batch {spec.batch_id}: {len(doc_ids)} documents x {len(tasks)} tasks, model {model_path.name}, "
            f"{'Ray at ' + a.ray_address if a.ray_address else 'local Ray'}, "
            f"{workers or 'cluster-sized'} workers x {threads} threads")
    try:
        pool = RayPool(engine, workers, threads, a.ray_address, verbose=a.verbose)
    except WorkerError as e:
        raise CliError(str(e)) from e
    except ConnectionError as e:
        raise CliError(f"cannot reach the Ray cluster at {a.ray_address}: {e}") from e
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
