"""The batch's workers as Ray actors, on this machine or on a cluster.

Without an address the driver starts a Ray runtime of its own here (no dashboard, no usage
statistics, bound to 127.0.0.1) with exactly the CPUs the workers' thread plans take; with one
it joins that cluster (`ray start --head` on one machine, `ray start --address HEAD:PORT` on
the others). Each actor loads the engine once (batch/worker.py) in a CPU slot of its machine
(batch/slots.py) and answers whole documents. A worker that dies mid-document (killed, out
of memory) is restarted by Ray and the document's task retried, up to ``RESTARTS`` times;
what it had answered is written only once, because the driver inserts results by their
unique key (app/store/batches.py).

This module imports only the standard library at its top: an actor's process imports it
before the actor claims its CPUs, and the engine must not be imported before then.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable, Iterator

RESTARTS = 3          # restarts of a dead worker, and retries of the document it was answering
IN_FLIGHT = 2         # documents queued per worker: the next one is there when one finishes
WAIT_S = 0.5          # how often the driver looks at its cancel flag while it waits
AUTH_HINT = ("if the cluster was started with RAY_AUTH_MODE=disabled, run this with RAY_AUTH_MODE=disabled too; "
             "with token authentication (ray start's default) its token must be in ~/.ray/auth_token or "
             "RAY_AUTH_TOKEN")
STARTUP_S = 600      # how long the workers may take to load (a cluster short of CPUs never starts them)
REPLACEMENTS = 4      # workers given up on after their restarts that are replaced by new ones


class BatchActor:
    """The Ray actor: one DocumentWorker in a CPU slot of its machine."""

    def __init__(self, engine, threads: int):
        from app.batch.slots import claim_slot, enter_slot

        self.slot = claim_slot(threads)
        enter_slot(self.slot)
        from app.batch.worker import DocumentWorker

        self.worker = DocumentWorker(engine)

    def name(self) -> str:
        return f"{self.worker.name} slot {self.slot.index}"

    def run(self, job, params):
        from app.batch.worker import DocumentOutcome

        try:
            return self.worker.run(job, params)
        except Exception as e:  # the document failed, not the worker: no retry
            return DocumentOutcome(job.content.doc_id, error=f"{type(e).__name__}: {e}", worker=self.worker.name)


def quiet_ray_environment() -> None:
    """Ray reports usage statistics unless told not to; eLLM never contacts the network."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"


def connect(address: str | None, num_cpus: int, verbose: bool = False) -> bool:
    """Join the cluster at ``address``, or start a local runtime of ``num_cpus`` CPUs; True
    when this call started one (so ``close`` stops it)."""
    quiet_ray_environment()
    if address:
        # `ray start` turns token authentication on and keeps the token in ~/.ray/auth_token; a
        # driver sends it only in token mode (read when ray is imported), so one whose token is
        # at hand says so. A cluster started with RAY_AUTH_MODE=disabled wants the same setting
        # here (its workers never start for a driver in token mode): AUTH_HINT says so.
        token = os.environ.get("RAY_AUTH_TOKEN_PATH") or str(Path.home() / ".ray" / "auth_token")
        if "RAY_AUTH_MODE" not in os.environ and (os.environ.get("RAY_AUTH_TOKEN") or Path(token).is_file()):
            os.environ["RAY_AUTH_MODE"] = "token"
    import ray

    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, log_to_driver=verbose)
        return True
    # The workers a local runtime starts inherit this environment: they import this eLLM.
    root = str(Path(__file__).resolve().parents[2])
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=verbose, _node_ip_address="127.0.0.1")
    return True


def cluster_cpus() -> int:
    import ray

    return int(ray.cluster_resources().get("CPU", 0))


class RayPool:
    """``workers`` actors of ``threads`` threads each (batch/pools.py's interface)."""

    def __init__(self, engine, workers: int, threads: int, address: str | None = None, verbose: bool = False):
        from app.batch.worker import WorkerError

        self.engine, self.threads = engine, threads
        self.started = connect(address, workers * threads, verbose)
        import ray

        if address and workers <= 0:
            workers = max(1, cluster_cpus() // threads)
        self.workers = workers
        self._actor_class = ray.remote(num_cpus=threads, max_restarts=RESTARTS,
                                       max_task_retries=RESTARTS)(BatchActor)
        self.actors = [self._new_actor() for _ in range(workers)]
        self.replaced = 0
        try:
            self.names = ray.get([a.name.remote() for a in self.actors], timeout=STARTUP_S)
        except ray.exceptions.GetTimeoutError as e:
            cpus = cluster_cpus()
            self.close()
            raise WorkerError(f"the {workers} workers did not start within {STARTUP_S} s; the cluster has {cpus} "
                              f"CPUs for {workers} workers x {threads} threads") from e
        except ray.exceptions.RayError as e:
            self.close()
            hint = f" ({AUTH_HINT})" if address else ""
            raise WorkerError(f"the batch workers could not start: {cause(e)}{hint}") from e

    def _new_actor(self):
        return self._actor_class.remote(self.engine, self.threads)

    def outcomes(self, jobs: Iterable, params, cancel: Callable[[], bool] | None = None) -> Iterator:
        import ray

        from app.batch.worker import DocumentOutcome

        queue = iter(jobs)
        in_flight: dict = {}       # object ref -> (actor index, job)
        load = [0] * len(self.actors)

        def submit() -> bool:
            i = min(range(len(self.actors)), key=load.__getitem__)
            if load[i] >= IN_FLIGHT or (cancel is not None and cancel()):
                return False
            job = next(queue, None)
            if job is None:
                return False
            in_flight[self.actors[i].run.remote(job, params)] = (i, job)
            load[i] += 1
            return True

        while submit():
            pass
        while in_flight:
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=WAIT_S)
            if cancel is not None and cancel():
                return
            for ref in ready:
                i, job = in_flight.pop(ref)
                load[i] -= 1
                try:
                    yield ray.get(ref)
                except ray.exceptions.RayError as e:
                    yield DocumentOutcome(job.content.doc_id, error=f"its worker died with no restarts left "
                                                                    f"(Ray restarts one {RESTARTS} times): {cause(e)}")
                    self._replace_if_dead(i)
            while submit():
                pass

    def _replace_if_dead(self, i: int) -> None:
        """A worker out of restarts is replaced by a new one (a few times per batch), so one
        poisonous document does not take a worker away from all the others."""
        import ray

        try:
            ray.get(self.actors[i].name.remote(), timeout=60)
        except ray.exceptions.RayError:
            if self.replaced < REPLACEMENTS:
                self.replaced += 1
                self.actors[i] = self._new_actor()

    def close(self) -> None:
        import ray

        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # already gone
                pass
        if self.started:
            ray.shutdown()


def cause(e: BaseException) -> str:
    """The first line of what went wrong inside Ray, without its traceback."""
    text = str(e).strip().splitlines()
    return next((line for line in reversed(text) if line.strip()), type(e).__name__)[:300]
