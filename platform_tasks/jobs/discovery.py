"""Discover scheduled jobs: import every selected file and collect its one definition.

Beat, every worker and :class:`platform_tasks.testing.JobTestScheduler` discover with
this module and the shared file rule in :mod:`platform_tasks.jobs.selection`, so they
agree on the set of jobs. Every problem is a :class:`JobDefinitionError` naming the file
and, where there is one, the ``define_job`` argument.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import sys
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path

from platform_tasks.errors import JobDefinitionError
from platform_tasks.jobs.definition import JobDefinition, collecting
from platform_tasks.jobs.points import Schedule, schedule_for
from platform_tasks.jobs.selection import path_label, select_job_files
from platform_tasks.settings import PlatformSettings

__all__ = ["DiscoveredJob", "JobSet", "discover_from_settings", "discover_jobs"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DiscoveredJob:
    """A definition with its final name, its file and its point rules."""

    name: str
    definition: JobDefinition
    schedule: Schedule
    file: Path

    @property
    def enabled(self) -> bool:
        return self.definition.enabled


@dataclass(frozen=True)
class JobSet:
    """Every discovered job (disabled ones too), keyed by unique name."""

    jobs: tuple[DiscoveredJob, ...] = ()

    def __iter__(self) -> Iterator[DiscoveredJob]:
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)

    @property
    def active(self) -> tuple[DiscoveredJob, ...]:
        return tuple(job for job in self.jobs if job.enabled)

    @cached_property
    def _by_name(self) -> dict[str, DiscoveredJob]:
        return {job.name: job for job in self.jobs}

    def get(self, name: str) -> DiscoveredJob | None:
        return self._by_name.get(name)


_MODULE_PREFIX = "_platform_jobs_"


def _module_name(root: Path, label: str) -> str:
    digest = hashlib.sha1(str(root).encode()).hexdigest()[:10]
    return f"{_MODULE_PREFIX}{digest}.{label}"


def _failed_relative_import(exc: Exception, module_name: str) -> bool:
    """Whether ``exc`` is a relative import in the job file itself failing.

    The generated module name has a parent package that does not exist, so
    ``from ._common import X`` fails looking for that parent, and ``from .. import X``
    goes past the top of it.
    """
    if not isinstance(exc, ImportError):
        return False
    if isinstance(exc, ModuleNotFoundError):
        return exc.name is not None and module_name.startswith(exc.name + ".")
    return "relative import beyond top-level package" in str(exc)


def _line_in(exc: BaseException, file: Path) -> int | None:
    """The line of ``file`` that raised ``exc`` (the innermost frame in that file)."""
    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == str(file):
            line = lineno
    return line


def _relative_import_error(exc: Exception, file: Path) -> JobDefinitionError:
    line = _line_in(exc, file)
    where = f" (line {line})" if line is not None else ""
    return JobDefinitionError(
        f"relative imports are not supported in job files{where}: job files are imported "
        "on their own, not as part of a package; use an absolute import, e.g. "
        "from beat_schedules._common import X",
        file=str(file),
    )


def _import_definitions(root: Path, file: Path) -> list[JobDefinition]:
    label = path_label(root, file)
    shown = str(file)
    spec = importlib.util.spec_from_file_location(_module_name(root, label), file)
    if spec is None or spec.loader is None:
        raise JobDefinitionError("cannot be imported as a Python module", file=shown)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    with collecting(shown) as found:
        try:
            spec.loader.exec_module(module)
        except JobDefinitionError:
            raise
        except Exception as exc:
            sys.modules.pop(spec.name, None)
            if _failed_relative_import(exc, spec.name):
                raise _relative_import_error(exc, file) from exc
            raise JobDefinitionError(
                f"importing failed: {type(exc).__name__}: {exc}", file=shown
            ) from exc
    return found


def _make_importable(folder: Path) -> None:
    """Put the folder that holds the jobs folder on ``sys.path`` (at the end).

    Job files share helpers through absolute imports (``from beat_schedules._common
    import X``). ``celery -A`` has the working directory on ``sys.path`` only while it
    imports the app, and discovery runs later (a worker bootstep, beat's set-up), so
    without this such an import fails in exactly the deployments the README describes.
    Appended, so it never shadows an installed module.
    """
    entry = str(folder)
    if entry not in sys.path:
        sys.path.append(entry)


def _check_has_future_point(job: DiscoveredJob, now: datetime) -> None:
    try:
        job.schedule.next_after(now)
    except JobDefinitionError as exc:
        raise JobDefinitionError(exc.detail, file=str(job.file), field="cron") from None


def discover_jobs(
    root: Path,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    now: datetime,
) -> JobSet:
    """Import the selected files under ``root`` and validate the jobs they define.

    Each selected file must define exactly one job; names (given or inferred from the
    path) must be unique across enabled and disabled jobs; every enabled job must have a
    point after ``now``.
    """
    base = root.absolute()
    _make_importable(base.parent)
    jobs: list[DiscoveredJob] = []
    seen: dict[str, Path] = {}
    for file in select_job_files(base, include, exclude):
        definitions = _import_definitions(base, file)
        if len(definitions) != 1:
            raise JobDefinitionError(
                f"must define exactly one job with define_job(), found {len(definitions)}",
                file=str(file),
            )
        definition = definitions[0].with_origin(name=path_label(base, file), file=str(file))
        assert definition.name is not None
        if definition.name in seen:
            raise JobDefinitionError(
                f"job name {definition.name!r} is already defined by {seen[definition.name]}",
                file=str(file),
                field="name",
            )
        seen[definition.name] = file
        job = DiscoveredJob(
            name=definition.name,
            definition=definition,
            schedule=schedule_for(definition),
            file=file,
        )
        if job.enabled:
            _check_has_future_point(job, now)
        jobs.append(job)
    return JobSet(tuple(jobs))


def discover_from_settings(settings: PlatformSettings, *, now: datetime) -> JobSet:
    """Discovery as configured: nothing when ``jobs_enabled`` is false.

    A missing default ``beat_schedules`` folder means no jobs; a ``PLATFORM_JOBS_DIR``
    set explicitly to a folder that does not exist is an error (a typo would otherwise
    silently schedule nothing).
    """
    if not settings.jobs_enabled:
        logger.info("scheduled jobs disabled", extra={"event": "jobs.disabled"})
        return JobSet()
    root = settings.jobs_dir
    if not root.is_dir():
        if "jobs_dir" in settings.model_fields_set:
            raise JobDefinitionError(f"PLATFORM_JOBS_DIR={root} is not a directory", file=str(root))
        logger.info("no jobs directory %s", root, extra={"event": "jobs.no_directory"})
        return JobSet()
    return discover_jobs(
        root, include=settings.jobs_include, exclude=settings.jobs_exclude, now=now
    )
