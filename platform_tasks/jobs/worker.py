"""Worker side of scheduled jobs: the ``platform.jobs.run`` task, start-up validation and
shutdown.

Workers discover ``beat_schedules/`` themselves (same rules as beat), so a trigger names
the job and the handler comes from the worker's own validated definitions; nothing but
the point and the lease token crosses the broker.

The runner task acknowledges on receipt (not late): a redelivered trigger would run a
point twice, and a lost one is just a skipped point, which the rules allow.

Shutdown (warm): the worker stops consuming, requests cancellation of running handlers
(in prefork children through ``SIGUSR2``), waits up to ``jobs_shutdown_budget_seconds``
in total, then kills the pool processes still running a handler and releases their
leases, and finally closes the Redis client it owns. Cold shutdown (SIGQUIT, a second
Ctrl+C) waits for nothing: the handlers' pool processes are killed and their leases
released at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from celery import bootsteps
from celery.signals import task_received, worker_process_init
from celery.worker import state as worker_state

from platform_tasks.app_state import AppState
from platform_tasks.brokers.worker_queues import add_queue_source
from platform_tasks.jobs.runner import REGISTRY, run_point
from platform_tasks.jobs.runtime import JobRuntime, app_name, runtime_mode, start_jobs

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = ["RUN_TASK", "RUN_TIME_LIMIT_SECONDS", "JobsWorkerStep", "install"]

logger = logging.getLogger("platform_tasks.jobs")

RUN_TASK = "platform.jobs.run"

RUN_TIME_LIMIT_SECONDS = 365 * 24 * 3600
"""The hard time limit of ``platform.jobs.run`` on RabbitMQ: in effect none. A job runs as
long as its lease allows (renewed every ``lease_ttl / 3`` while it runs). Its trigger is
acknowledged on receipt, so RabbitMQ's ``consumer_timeout`` never concerns it, and the
``task_time_limit`` the platform derives from that timeout for late-acknowledged tasks
(``consumer_timeout`` - 60 s) must not cut it. Celery has no per-task "no limit" once
``task_time_limit`` is set (0 or ``None`` fall back to it), hence a year."""

_RUNTIME: AppState[JobRuntime] = AppState("platform_jobs_runtime")
"""The app's validated jobs, made once (a prefork child reads its parent's)."""
_CANCEL_SIGNAL = signal.SIGUSR2


def _runtime(app: PlatformCelery) -> JobRuntime:
    return _RUNTIME.get_or_set(
        app,
        lambda: start_jobs(
            app.platform_settings, app_name=app_name(app), mode=runtime_mode(app), role="worker"
        ),
    )


def runtime_of(app: PlatformCelery) -> JobRuntime | None:
    """The jobs a worker of ``app`` validated in this process (or its parent), if any."""
    return _RUNTIME.get(app)


def _register_task(app: PlatformCelery) -> None:
    from platform_tasks.brokers.selection import broker_kind

    on_rabbitmq = broker_kind(app.platform_settings.effective_broker_url) == "amqp"

    @app.task(  # type: ignore[untyped-decorator]
        name=RUN_TASK,
        acks_late=False,
        reject_on_worker_lost=False,
        ignore_result=True,
        max_retries=0,
        shared=False,
        time_limit=RUN_TIME_LIMIT_SECONDS if on_rabbitmq else None,
    )
    def run_job(job: str, point_ms: int, period_end_ms: int, token: str, lease_ttl_ms: int) -> None:
        runtime = _runtime(app)
        if runtime.leases is None:
            logger.error(
                "job %s triggered but no job is active in this worker",
                job,
                extra={"event": "jobs.run_unknown", "job": job},
            )
            return
        run_point(
            runtime.jobs,
            runtime.leases,
            job=job,
            point_ms=point_ms,
            period_end_ms=period_end_ms,
            token=token,
            lease_ttl_ms=lease_ttl_ms,
        )


def _on_cancel_signal(signum: int, frame: Any) -> None:
    REGISTRY.cancel_all()


def _install_child_handler(**_: Any) -> None:
    """In each prefork child: SIGUSR2 requests cancellation of the running handlers."""
    signal.signal(_CANCEL_SIGNAL, _on_cancel_signal)


class JobsWorkerStep(bootsteps.StartStopStep):
    """Validates jobs when the worker is built (before it consumes) and runs shutdown."""

    label = "platform scheduled jobs"
    requires = ("celery.worker.components:Pool",)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        # Raising here aborts the worker before any task is consumed.
        self.runtime = _runtime(worker.app)
        self.budget = worker.app.platform_settings.jobs_shutdown_budget_seconds
        self._received: weakref.WeakSet[Any] = weakref.WeakSet()  # run requests, for terminate

    def stop(self, worker: Any) -> None:
        self._shutdown(worker)

    def shutdown(self, worker: Any) -> None:
        self._shutdown(worker)

    def start(self, worker: Any) -> None:
        task_received.connect(self._on_received, weak=False)

    def _on_received(self, sender: Any = None, request: Any = None, **_: Any) -> None:
        if request is not None and request.name == RUN_TASK:
            self._received.add(request)

    def terminate(self, worker: Any) -> None:
        """A cold shutdown (SIGQUIT, a second SIGTERM/Ctrl+C) waits for nothing: running
        handlers are killed at once and their leases released, so their jobs' next
        points are not blocked for ``lease_ttl``.

        Celery's cold-shutdown handler cancels active requests (SIGTERM to their pool
        processes, out of ``active_requests``) before the steps terminate, so the runs are
        found among the requests this worker received, not in ``active_requests``. A
        release names the run's token, so a run that had already finished (and given its
        lease back) is left alone.
        """
        task_received.disconnect(self._on_received)
        if self.runtime.closed:
            return
        REGISTRY.cancel_all()
        running = set(self._job_requests())
        for request in list(self._received):
            if request.time_start and (request in running or request._already_cancelled):
                self._abandon(request, why="by a cold shutdown")
        self.runtime.close()

    def _job_requests(self) -> list[Any]:
        return [r for r in list(worker_state.active_requests) if r.name == RUN_TASK]

    def _shutdown(self, worker: Any) -> None:
        if self.runtime.closed:
            return
        requests = self._job_requests()
        REGISTRY.cancel_all()
        pids = {r.worker_pid for r in requests if r.worker_pid and r.worker_pid != os.getpid()}
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, _CANCEL_SIGNAL)
        if requests:
            logger.info(
                "cancellation requested for %d running job(s)",
                len(requests),
                extra={"event": "jobs.shutdown_cancel"},
            )
        deadline = time.monotonic() + self.budget
        while self._job_requests() and time.monotonic() < deadline:
            time.sleep(0.05)  # polling the worker's own state, bounded by the budget
        for request in self._job_requests():
            self._abandon(request)
        self.runtime.close()

    def _abandon(self, request: Any, why: str = "after the shutdown budget") -> None:
        pid = request.worker_pid
        if not pid or pid == os.getpid():
            logger.warning(
                "job still running past the shutdown budget",
                extra={"event": "jobs.shutdown_overrun"},
            )
            return
        if _is_child(pid):  # never a process that took a dead pool process's pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        kwargs = request.kwargs or {}
        leases = self.runtime.leases
        if leases is not None and "job" in kwargs:
            with contextlib.suppress(Exception):
                leases.release(kwargs["job"], token=kwargs["token"])
        logger.warning(
            "job %s killed %s; lease released",
            kwargs.get("job"),
            why,
            extra={"event": "jobs.shutdown_killed", "job": kwargs.get("job")},
        )


def _is_child(pid: int) -> bool:
    """``pid`` is a live (not yet reaped) child of this process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] != "Z" and int(fields[1]) == os.getpid()


def _job_queues(app: PlatformCelery) -> list[str]:
    """The queues active job definitions send their triggers to."""
    return [job.definition.queue for job in _runtime(app).jobs.active]


def install(app: PlatformCelery) -> None:
    """Register the runner task; validate jobs and handle shutdown in every worker."""
    _register_task(app)
    add_queue_source(app, _job_queues)
    app.steps["worker"].add(JobsWorkerStep)
    worker_process_init.connect(
        _install_child_handler, weak=False, dispatch_uid="platform_tasks.jobs.cancel_signal"
    )
