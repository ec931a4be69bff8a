"""``platform-tasks dev``: run the whole platform locally on embedded servers."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType

import click

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
    beat_replicas: int,
    samples: int,
    jobs_dir: Path | None,
) -> None:
    """Start Redis, PostgreSQL, a worker, beat replicas and Flower; Ctrl-C stops them all.

    PLATFORM_REDIS_URL / PLATFORM_DATABASE_URL, when set, are used instead of embedded
    servers. A change under the jobs directory restarts worker and beat cold.
    """
    import os

    project_dir = Path.cwd()
    jobs = jobs_dir or Path(os.environ.get("PLATFORM_JOBS_DIR", "beat_schedules"))
    options = DevOptions(
        app=app,
        project_dir=project_dir,
        data_dir=data_dir.resolve(),
        flower_port=flower_port,
        beat_replicas=beat_replicas,
        samples=samples,
        jobs_dir=jobs.resolve(),
    )
    platform = DevPlatform(options, say=lambda line: click.echo(line))
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    restart_lock = threading.Lock()

    def restart(paths: set[str]) -> None:
        with restart_lock:
            if stop.is_set():
                return
            click.echo(f"Changed     {', '.join(sorted(paths))}: restarting worker and beat")
            platform.stop_workers_and_beat()
            platform.start_workers_and_beat()
            click.echo(f"Restarted   generation {platform.generation}")

    try:
        platform.start_servers()
        platform.start_workers_and_beat()
        platform.start_flower()
        platform.wait_for_flower()
        job_ids = platform.publish_samples()
        logs = platform.logs_dir
        click.echo(f"Samples     published {len(job_ids)}: {' '.join(job_ids)}")
        click.echo(f"Flower      http://127.0.0.1:{options.flower_port}/")
        click.echo(f"Logs        {logs}/worker.log, {logs}/beat-*.log, {logs}/flower.log")
        click.echo("Ready       Ctrl-C stops everything")
        watcher = threading.Thread(
            target=watch_for_changes, args=(options.jobs_dir, restart, stop), daemon=True
        )
        watcher.start()
        stop.wait()
    finally:
        click.echo("Stopping    worker, beat, Flower and embedded servers")
        stop.set()
        with restart_lock:
            platform.shutdown()
        click.echo("Stopped")
