"""``platform-tasks schedules list``: the jobs a beat or worker would run, after full validation.

Unlike the static ``docs``/``check`` commands this imports the job files, exactly like
beat does (same discovery, same validation), and shows each job's running lease and next
three points computed by the rule code beat uses (:mod:`platform_tasks.jobs.points`).

Settings come from the environment and, for the selected profile, from
``pyproject.toml`` (``[tool.platform-tasks.profiles.<profile>]`` over
``[tool.platform-tasks]``, read by the same code as the static commands); an environment
variable wins over both. The working directory goes first on ``sys.path``, as with
``celery -A``, so job files can ``from beat_schedules._common import X``.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click

from platform_tasks.errors import ConfigurationError
from platform_tasks.jobdocs.config import declared_settings, default_profile
from platform_tasks.jobs.discovery import DiscoveredJob, discover_from_settings
from platform_tasks.settings import PlatformSettings, variable_name

__all__ = ["list_jobs", "runtime_settings"]

POINTS_SHOWN = 3


def runtime_settings(
    project_dir: Path, profile: str, environ: dict[str, str] | None = None
) -> PlatformSettings:
    """The settings beat would run with for ``profile`` in ``project_dir``.

    Each setting declared in ``pyproject.toml`` for the profile stands in for its
    environment variable unless the environment sets that variable; ``profile`` is the
    profile setting itself.
    """
    environ = dict(os.environ) if environ is None else environ
    values: dict[str, str] = {}
    for key, setting in declared_settings(project_dir, profile).items():
        if key in PlatformSettings.model_fields and key != "profile":
            values[variable_name(key)] = _as_variable(setting.value)
    values.update(environ)
    values[variable_name("profile")] = profile
    try:
        return PlatformSettings.from_env(values)
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"profile {profile!r} (environment and pyproject.toml): {exc}"
        ) from exc


def _as_variable(value: Any) -> str:
    """A ``pyproject.toml`` value written the way its environment variable is."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(item) for item in value)
    return str(value)


@dataclass(frozen=True)
class _Row:
    job: DiscoveredJob
    lease: timedelta | None
    points: tuple[datetime, ...]

    def as_json(self) -> dict[str, Any]:
        definition = self.job.definition
        return {
            "name": self.job.name,
            "file": str(self.job.file),
            "schedule": _schedule(self.job),
            "timezone": definition.timezone,
            "enabled": definition.enabled,
            "queue": definition.queue,
            "lease_ttl": None if self.lease is None else self.lease.total_seconds(),
            "lease_ttl_default": definition.lease_ttl is None,
            "next_point": self.points[0].isoformat() if self.points else None,
            "next_points": [point.isoformat() for point in self.points],
        }


def _schedule(job: DiscoveredJob) -> str:
    definition = job.definition
    return definition.cron or f"every {definition.interval}"


def _row(job: DiscoveredJob, now: datetime) -> _Row:
    """Next points strictly after ``now`` (none for a disabled job: beat never fires it)
    and the running lease beat would take at the next point."""
    points: list[datetime] = []
    if job.enabled:
        point = now
        for _ in range(POINTS_SHOWN):
            point = job.schedule.next_after(point)
            points.append(point)
    lease = None
    if points:
        lease = job.schedule.lease_ttl_for(points[0])
    elif job.definition.lease_ttl is not None:
        lease = job.definition.lease_ttl
    elif job.definition.interval is not None:
        # The interval default does not depend on the point.
        lease = job.schedule.lease_ttl_for(job.schedule.next_after(now))
    return _Row(job, lease, tuple(points))


def _duration(value: timedelta) -> str:
    seconds = value.total_seconds()
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{int(count)}{unit}")
    if seconds or not parts:
        parts.append(f"{seconds:g}s")
    return "".join(parts)


def _shown_file(file: Path, cwd: Path) -> str:
    try:
        return file.relative_to(cwd).as_posix()
    except ValueError:
        return str(file)


def _table(rows: list[_Row], cwd: Path) -> str:
    header = ("NAME", "SCHEDULE", "TIMEZONE", "ENABLED", "LEASE", "NEXT 3 POINTS (UTC)", "FILE")
    lines = [header]
    for row in rows:
        definition = row.job.definition
        if row.lease is None:
            lease = "-"
        else:
            lease = _duration(row.lease) + (" (default)" if definition.lease_ttl is None else "")
        points = ", ".join(p.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") for p in row.points)
        lines.append(
            (
                row.job.name,
                _schedule(row.job),
                definition.timezone,
                "yes" if definition.enabled else "no",
                lease,
                points or "-",
                _shown_file(row.job.file, cwd),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    widths[-1] = 0  # the last column is not padded
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        for line in lines
    )


def _project_on_path(cwd: Path) -> None:
    """Put the working directory first on ``sys.path``, as ``celery -A`` does."""
    entry = str(cwd)
    if entry not in sys.path:
        sys.path.insert(0, entry)


@click.command("list")
@click.option(
    "--profile",
    default=None,
    help="Profile whose settings apply (default: $PLATFORM_PROFILE, else development).",
)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
def list_jobs(profile: str | None, fmt: str) -> None:
    """List discovered jobs (disabled ones too) with their lease and next three points."""
    cwd = Path.cwd()
    environ = dict(os.environ)
    profile = profile or default_profile(environ)
    try:
        settings = runtime_settings(cwd, profile, environ)
        _project_on_path(cwd)
        now = datetime.now(UTC)
        rows = [_row(job, now) for job in discover_from_settings(settings, now=now)]
    except ConfigurationError as exc:  # DocsConfigError included
        raise click.ClickException(str(exc)) from exc
    if fmt == "json":
        click.echo(json.dumps([row.as_json() for row in rows], indent=2))
        return
    if not settings.jobs_enabled:
        click.echo(f"scheduled jobs are disabled (jobs_enabled=false, profile {profile!r})")
    elif not rows:
        click.echo(f"no scheduled jobs in {settings.jobs_dir} (profile {profile!r})")
    else:
        click.echo(_table(rows, cwd))
