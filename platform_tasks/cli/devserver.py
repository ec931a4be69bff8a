"""The local platform behind ``platform-tasks dev``: servers, processes, restarts, clean exit.

One command gives a developer the whole platform on embedded defaults — real Redis and
PostgreSQL (unless the environment points at existing ones), migrations, a worker, two
beat replicas, Flower and the operations console — and stops every process it started
when interrupted. Worker and beat are restarted cold when a job definition changes, so no
timer of an old definition survives.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from platform_tasks.postgres.migrations import migrate
from platform_tasks.settings import PlatformSettings, redact_url
from platform_tasks.testing.servers import PostgresServer, RedisServer, free_port, wait_until

logger = logging.getLogger(__name__)


@dataclass
class ManagedProcess:
    """A child process of the dev platform with its own log file."""

    name: str
    argv: list[str]
    log_path: Path
    env: Mapping[str, str]
    cwd: Path
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                self.argv,
                env=dict(self.env),
                cwd=self.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def stop(self, timeout: float = 20.0) -> None:
        """Warm shutdown, then SIGKILL of the whole process group at the deadline."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)
        self.popen = None


@dataclass
class DevOptions:
    app: str
    project_dir: Path
    data_dir: Path
    flower_port: int
    beat_replicas: int
    samples: int
    jobs_dir: Path
    console_port: int = 8000


class DevPlatform:
    """Starts and supervises everything ``platform-tasks dev`` runs."""

    def __init__(self, options: DevOptions, say: Callable[[str], None]) -> None:
        self.options = options
        self.say = say
        self.redis: RedisServer | None = None
        self.postgres: PostgresServer | None = None
        self.env: dict[str, str] = {}
        self.workers: list[ManagedProcess] = []
        self.beats: list[ManagedProcess] = []
        self.flower: ManagedProcess | None = None
        self.console: ManagedProcess | None = None
        self.generation = 0
        self.samples_correlation_id: str | None = None

    @property
    def logs_dir(self) -> Path:
        return self.options.data_dir / "logs"

    def start_servers(self) -> None:
        # Validate what the operator set before starting anything: a bad URL fails here,
        # naming its variable with the password masked, instead of inside a child process.
        PlatformSettings.from_env()
        redis_url = os.environ.get("PLATFORM_REDIS_URL")
        database_url = os.environ.get("PLATFORM_DATABASE_URL")
        data = self.options.data_dir
        data.mkdir(parents=True, exist_ok=True)
        data.chmod(0o755)
        if not redis_url:
            self.redis = RedisServer(data / "redis").start()
            redis_url = self.redis.url
            self.say(f"Redis       {redis_url} (embedded, files in {data / 'redis'})")
        else:
            self.say(f"Redis       {redact_url(redis_url)} (from PLATFORM_REDIS_URL)")
        if not database_url:
            self.postgres = PostgresServer(data / "postgres" / "data").start()
            database_url = self.postgres.url
            self.say(f"PostgreSQL  {database_url} (embedded, files in {self.postgres.data_dir})")
        else:
            self.say(f"PostgreSQL  {redact_url(database_url)} (from PLATFORM_DATABASE_URL)")
        applied = migrate(database_url)
        self.say(f"Migrations  {'applied ' + str(applied) if applied else 'up to date'}")
        self.env = {k: v for k, v in os.environ.items()}
        self.env.update(
            PLATFORM_REDIS_URL=redis_url,
            PLATFORM_DATABASE_URL=database_url,
            PLATFORM_PROFILE=os.environ.get("PLATFORM_PROFILE", "development"),
            PLATFORM_JOBS_DIR=str(self.options.jobs_dir),
            PYTHONUNBUFFERED="1",
        )
        pythonpath = [str(self.options.project_dir)]
        if self.env.get("PYTHONPATH"):
            pythonpath.append(self.env["PYTHONPATH"])
        self.env["PYTHONPATH"] = os.pathsep.join(pythonpath)

    def _celery(self, *args: str) -> list[str]:
        celery = Path(sys.executable).with_name("celery")
        return [str(celery), "-A", self.options.app, *args]

    def _process(
        self, name: str, argv: list[str], env: Mapping[str, str] | None = None
    ) -> ManagedProcess:
        process = ManagedProcess(
            name, argv, self.logs_dir / f"{name}.log", env or self.env, self.options.project_dir
        )
        process.start()
        return process

    def worker_argv(self) -> list[str]:
        """The worker command, as a user types it: no ``-Q``, so it consumes ``default``
        and every queue the platform routes to (the jobs' queues among them)."""
        return self._celery("worker", "--loglevel", "INFO", "-n", "dev-worker@%h", "-c", "2")

    def beat_argv(self) -> list[str]:
        return self._celery("beat", "--loglevel", "INFO")

    def start_workers_and_beat(self) -> None:
        """(Re)start worker and beat replicas from scratch: a cold start, no old timers."""
        self.generation += 1
        self.workers = [self._process("worker", self.worker_argv())]
        self.beats = [
            self._process(f"beat-{n}", self.beat_argv())
            for n in range(1, self.options.beat_replicas + 1)
        ]

    def stop_workers_and_beat(self) -> None:
        for process in [*self.beats, *self.workers]:
            process.stop()
        self.beats, self.workers = [], []

    def start_flower(self) -> None:
        port = self.options.flower_port or free_port()
        self.options.flower_port = port
        self.flower = self._process(
            "flower", self._celery("flower", f"--port={port}", "--address=127.0.0.1")
        )

    def wait_for_flower(self, timeout: float = 60.0) -> None:
        url = f"http://127.0.0.1:{self.options.flower_port}/"
        wait_until(
            lambda: _answers(url), timeout=timeout, interval=0.25, message=f"Flower at {url}"
        )

    @property
    def console_url(self) -> str:
        return f"http://127.0.0.1:{self.options.console_port}/"

    def job_search_url(self, text: str) -> str:
        """The console's "Find a job" page answering ``text`` (a job or correlation id)."""
        return f"{self.console_url}admin/platform_console/queue/jobs/?q={quote(text)}"

    def start_console(self, login_env: Mapping[str, str]) -> None:
        """``platform-tasks console`` on loopback, its admin user set from ``login_env``
        (:mod:`platform_tasks.cli.dev_login`); the password travels in its environment
        only, never on its command line."""
        port = self.options.console_port or free_port()
        self.options.console_port = port
        argv = [sys.executable, "-m", "platform_tasks.cli", "console", "--port", str(port)]
        self.console = self._process("console", argv, {**self.env, **login_env})

    def wait_for_console(self, timeout: float = 90.0) -> bool:
        """Whether the console answers its login page (``False``: it exited, e.g. without
        the django extra; its log says why)."""
        console = self.console
        url = f"{self.console_url}admin/login/"
        wait_until(
            lambda: (
                console is None
                or console.popen is None
                or console.popen.poll() is not None
                or _answers(url)
            ),
            timeout=timeout,
            interval=0.25,
            message=f"the console at {url}",
        )
        return console is not None and console.popen is not None and console.popen.poll() is None

    def publish_samples(self) -> list[str]:
        """Call the app module's ``publish_samples(count)``, in a child process.

        The samples belong to the application (its kinds, its queues), so the composition
        root defines them; an app without the function simply gets none. They are
        published under one correlation id (:attr:`samples_correlation_id`, set as the
        current one unless the app's function names its own), so a newcomer can find
        them together in the console as well as one by one.
        """
        if self.options.samples <= 0:
            return []
        module_name = self.options.app.split(":")[0]
        correlation_id = f"dev-samples-{secrets.token_hex(4)}"
        code = (
            "import importlib\n"
            "from platform_tasks.observability.context import current_correlation_id\n"
            f"current_correlation_id.set({correlation_id!r})\n"
            f"module = importlib.import_module({module_name!r})\n"
            "publish = getattr(module, 'publish_samples', None)\n"
            f"for job_id in (publish({self.options.samples}) if publish else []):\n"
            "    print(job_id)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code],
            env=self.env,
            cwd=self.options.project_dir,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if out.returncode != 0:
            self.say(f"Samples     not published: {out.stderr.strip().splitlines()[-1:]}")
            return []
        job_ids = out.stdout.split()
        self.samples_correlation_id = correlation_id if job_ids else None
        return job_ids

    def all_pids(self) -> list[int]:
        processes: Iterable[ManagedProcess | None] = [
            *self.workers,
            *self.beats,
            self.flower,
            self.console,
        ]
        return [p.pid for p in processes if p is not None and p.pid is not None]

    def shutdown(self) -> None:
        self.stop_workers_and_beat()
        for process in (self.console, self.flower):
            if process is not None:
                process.stop()
        self.console = self.flower = None
        if self.postgres is not None:
            # close, not stop: a cluster the harness had to put in a private temporary
            # folder (the data folder unreachable by the unprivileged user it runs as) is
            # deleted with it, instead of one left in /tmp per run; the data folder's own
            # cluster is kept for the next run.
            self.postgres.close()
            self.postgres = None
        if self.redis is not None:
            self.redis.stop()
            self.redis = None


def _answers(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def definition_changes(paths: Iterable[str]) -> set[str]:
    """The changed paths that can change a job definition.

    Python's bytecode cache is written by the very processes a restart starts (beat and
    the worker import the job files), so ``__pycache__`` and ``.pyc`` changes are left
    out; otherwise adding a job would restart everything twice. Editor backups too.
    """
    return {
        path
        for path in paths
        if not path.endswith((".pyc", "~")) and "__pycache__" not in Path(path).parts
    }


def watch_for_changes(
    jobs_dir: Path, on_change: Callable[[set[str]], None], stop: threading.Event
) -> None:
    """Call ``on_change`` with changed paths whenever a file under ``jobs_dir`` changes."""
    from watchfiles import watch

    if not jobs_dir.exists():
        return
    for changes in watch(
        jobs_dir, stop_event=stop, debounce=400, step=100, raise_interrupt=False, rust_timeout=500
    ):
        paths = definition_changes(path for _, path in changes)
        if paths:
            on_change(paths)
