"""``platform-tasks dev``: run the whole platform locally on embedded servers, console included."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import click

from platform_tasks.cli.dev_login import DevLogin, dev_login
from platform_tasks.cli.devserver import DevOptions, DevPlatform, watch_for_changes


@click.command()
@click.option("--app", default="celery_app", show_default=True, help="Celery app module (-A).")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=Path(".data"),
    show_default=True,
    help="Where embedded servers keep their files and logs.",
)
@click.option(
    "--flower-port",
    type=int,
    default=5555,
    show_default=True,
    help="Flower's port (0 picks a free one).",
)
@click.option(
    "--console-port",
    type=int,
    default=8000,
    show_default=True,
    help="The operations console's port (0 picks a free one).",
)
@click.option("--beat-replicas", type=int, default=2, show_default=True)
@click.option(
    "--samples",
    type=int,
    default=3,
    show_default=True,
    help="Sample envelopes to publish once everything runs.",
)
@click.option(
    "--jobs-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Job definitions to watch (default: PLATFORM_JOBS_DIR or beat_schedules).",
)
def dev(
    app: str,
    data_dir: Path,
    flower_port: int,
    console_port: int,
    beat_replicas: int,
    samples: int,
    jobs_dir: Path | None,
) -> None:
    """Start Redis, PostgreSQL, a worker, beat replicas, Flower and the operations console;
    Ctrl-C stops them all.

    PLATFORM_REDIS_URL / PLATFORM_DATABASE_URL, when set, are used instead of embedded
    servers. A change under the jobs directory restarts worker and beat cold. The console
    is served on loopback with a development login, printed (or, when
    PLATFORM_CONSOLE_ADMIN_PASSWORD is set, that one, never printed).
    """
    jobs = jobs_dir or Path(os.environ.get("PLATFORM_JOBS_DIR", "beat_schedules"))
    options = DevOptions(
        app=app,
        project_dir=Path.cwd(),
        data_dir=data_dir.resolve(),
        flower_port=flower_port,
        beat_replicas=beat_replicas,
        samples=samples,
        jobs_dir=jobs.resolve(),
        console_port=console_port,
    )
    platform = DevPlatform(options, say=lambda line: click.echo(line))
    stop = _stop_on_signals()
    restart_lock = threading.Lock()
    try:
        _start(platform, dev_login(options.data_dir))
        restart = _restarter(platform, stop, restart_lock)
        watcher = threading.Thread(
            target=watch_for_changes, args=(options.jobs_dir, restart, stop), daemon=True
        )
        watcher.start()
        stop.wait()
    finally:
        click.echo("Stopping    worker, beat, Flower, the console and embedded servers")
        stop.set()
        with restart_lock:
            platform.shutdown()
        click.echo("Stopped")


def _stop_on_signals() -> threading.Event:
    """An event set by Ctrl-C (SIGINT) or SIGTERM."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return stop


def _restarter(
    platform: DevPlatform, stop: threading.Event, lock: threading.Lock
) -> Callable[[set[str]], None]:
    """What a change under the jobs directory does: restart worker and beat cold."""

    def restart(paths: set[str]) -> None:
        with lock:
            if stop.is_set():
                return
            click.echo(f"Changed     {', '.join(sorted(paths))}: restarting worker and beat")
            platform.stop_workers_and_beat()
            platform.start_workers_and_beat()
            click.echo(f"Restarted   generation {platform.generation}")

    return restart


def _start(platform: DevPlatform, login: DevLogin) -> None:
    """Start everything, publish the samples and say where to look."""
    platform.start_servers()
    platform.start_workers_and_beat()
    platform.start_flower()
    platform.start_console(login.console_env())
    platform.wait_for_flower()
    console_up = platform.wait_for_console()
    job_ids = platform.publish_samples()
    logs = platform.logs_dir
    click.echo(f"Samples     published {len(job_ids)}: {' '.join(job_ids)}")
    if platform.samples_correlation_id:
        click.echo(f"Samples     correlation id {platform.samples_correlation_id}")
    click.echo(f"Flower      http://127.0.0.1:{platform.options.flower_port}/")
    if console_up:
        click.echo(f"Console     {platform.console_url}")
        click.echo(f"Login       {login.describe()}")
        if job_ids:
            click.echo(f"Find a job  {platform.job_search_url(job_ids[0])}")
    else:
        click.echo(f"Console     not started: see {logs}/console.log")
    click.echo(
        f"Logs        {logs}/worker.log, {logs}/beat-*.log, {logs}/flower.log, {logs}/console.log"
    )
    click.echo("Ready       Ctrl-C stops everything")
