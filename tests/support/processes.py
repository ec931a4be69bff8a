"""Real ``celery worker`` / ``celery beat`` processes for end-to-end and fault tests.

Processes are started with the environment a user would set (``PLATFORM_*``), their
output goes to a log file the test can print on failure, and they are always reaped at
teardown, SIGKILLed if they do not stop in time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from platform_tasks.testing.servers import wait_until

VENV_BIN = Path(sys.executable).parent
CELERY = str(VENV_BIN / "celery")
FAIR_SWITCH = "TEST_FAIR_QUEUES"
"""``TEST_FAIR_QUEUES=*`` runs the suite's workers (and transport connections) with
``PLATFORM_FAIR_QUEUES`` set to it: the existing tests, with tenant fairness on."""


class CeleryProcess:
    """One celery process (worker or beat) started from a real command line."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        log_path: Path,
    ) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.cwd = cwd
        self.log_path = log_path
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> CeleryProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for_log(self, text: str, timeout: float = 60.0, *, after: int = 0) -> None:
        """Wait until ``text`` appears in the log (past byte offset ``after``)."""

        def seen() -> bool:
            if not self.running:
                raise AssertionError(f"process exited early:\n{self.log()[-4000:]}")
            return text in self.log()[after:]

        try:
            wait_until(seen, timeout=timeout, interval=0.1, message=f"{text!r} in {self.log_path}")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n--- log tail ---\n{self.log()[-4000:]}") from exc

    def children(self) -> list[int]:
        """Pids of the direct children (prefork pool processes)."""
        path = Path(f"/proc/{self.pid}/task/{self.pid}/children")
        try:
            return [int(pid) for pid in path.read_text().split()]
        except OSError:
            return []

    def signal(self, signum: int) -> None:
        if self.running:
            os.kill(self.pid, signum)

    def kill_group(self) -> None:
        """SIGKILL the process and everything in its session (pool children too)."""
        if self.popen is None:
            return
        with suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.popen.wait(timeout=30)

    def stop(self, timeout: float = 30.0) -> None:
        """Warm shutdown (SIGTERM); escalate to SIGKILL of the group at the deadline."""
        if self.popen is None:
            return
        if self.running:
            self.signal(signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=timeout)
        self.kill_group()


def platform_env(
    *,
    redis_url: str,
    database_url: str | None,
    extra: Mapping[str, str] | None = None,
    pythonpath: Sequence[Path] = (),
) -> dict[str, str]:
    """Environment for a worker/beat process, as an operator would export it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLATFORM_", "SENTRY_"))}
    env["PLATFORM_REDIS_URL"] = redis_url
    if database_url:
        env["PLATFORM_DATABASE_URL"] = database_url
    env["PLATFORM_PROFILE"] = "test"
    env["PYTHONUNBUFFERED"] = "1"
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    fair = os.environ.get(FAIR_SWITCH)
    broker = (extra or {}).get("PLATFORM_BROKER_URL", redis_url)
    stock = (extra or {}).get("PLATFORM_TRANSPORT") == "stock"
    if fair and not stock and broker.startswith(("redis://", "rediss://")):
        env["PLATFORM_FAIR_QUEUES"] = fair
    env.update(extra or {})
    return env


def worker_argv(
    app: str,
    *,
    queues: str | None = None,
    concurrency: int = 2,
    pool: str = "prefork",
    hostname: str = "w1@%h",
    extra: Sequence[str] = (),
) -> list[str]:
    """``celery -A app worker`` as a user starts it: no ``-Q``, so it consumes every queue
    the platform routes to. ``queues`` narrows it with ``-Q`` (a test passing it says
    why). Mingle and gossip are off only to save start-up time; they change no routing."""
    argv = [
        CELERY,
        "-A",
        app,
        "worker",
        "-P",
        pool,
        "-c",
        str(concurrency),
        "-n",
        hostname,
        "--loglevel",
        "INFO",
        "--without-mingle",
        "--without-gossip",
    ]
    if queues:
        argv += ["-Q", queues]
    return argv + list(extra)


def start_worker(
    started: list[CeleryProcess],
    app: str,
    *,
    env: Mapping[str, str],
    cwd: Path,
    log_path: Path,
    concurrency: int = 1,
    ready_timeout: float = 60.0,
) -> CeleryProcess:
    """Start ``celery -A app worker`` (no ``-Q``), register it for reaping, wait until ready."""
    worker = CeleryProcess(
        worker_argv(app, concurrency=concurrency), env=env, cwd=cwd, log_path=log_path
    )
    started.append(worker.start())
    worker.wait_for_log("ready.", timeout=ready_timeout)
    return worker


@contextmanager
def celery_processes() -> Iterator[list[CeleryProcess]]:
    """Collects started processes and reaps every one of them at exit."""
    started: list[CeleryProcess] = []
    try:
        yield started
    finally:
        for process in started:
            process.stop(timeout=15)
