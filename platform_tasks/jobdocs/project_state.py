"""The conservative project state: what the selected profile would schedule, if anything.

"Active" is only claimed on evidence (a definition known to be enabled and a switch known
to be on); whenever a missing piece could change the answer, the state is ``unknown``
and the reasons name the missing piece.
"""

from __future__ import annotations

from platform_tasks.jobdocs.config import DocsConfig
from platform_tasks.jobdocs.evidence import (
    FieldState,
    FileWithoutEvidence,
    JobEvidence,
    ProjectState,
    ProjectStateName,
)

__all__ = ["project_state"]


_NAMED_ACTIVE = 20
"""How many active jobs the project state names; a tree of thousands would otherwise
make its summary a wall of names (the jobs list has them all)."""


def _activity(job: JobEvidence) -> bool | None:
    """True active, False disabled, None when the source does not say."""
    enabled = job.fields["enabled"]
    if enabled.state is FieldState.ABSENT:
        return True
    if enabled.state is FieldState.KNOWN and isinstance(enabled.value, bool):
        return enabled.value
    return None


def _label(job: JobEvidence) -> str:
    name = job.fields["name"]
    return str(name.value) if name.state is not FieldState.UNKNOWN else f"<unknown> ({job.file})"


def _shown(config: DocsConfig) -> str:
    try:
        return config.jobs_dir.relative_to(config.project_dir).as_posix()
    except ValueError:
        return config.jobs_dir.as_posix()


def project_state(
    config: DocsConfig, jobs: list[JobEvidence], without_evidence: list[FileWithoutEvidence]
) -> ProjectState:
    """Summarise ``jobs`` under ``config``'s profile; see the module docstring."""
    switch = config.jobs_enabled
    if switch.known and switch.value is False:
        return ProjectState(
            ProjectStateName.GLOBALLY_DISABLED,
            [
                f"jobs_enabled is false ({switch.source})",
                f"{len(jobs)} definition(s) documented but not scheduled",
            ],
        )

    active: list[JobEvidence] = []
    undetermined: list[JobEvidence] = []
    for job in jobs:
        activity = _activity(job)
        if activity is True:
            active.append(job)
        elif activity is None:
            undetermined.append(job)
    gaps: list[str] = [f"enabled of {_label(job)} is not statically known" for job in undetermined]
    gaps += [f"{item.file} has no statically known definition" for item in without_evidence]

    if not jobs and not without_evidence:
        where = _shown(config)
        reason = (
            f"no job files selected under {where}"
            if config.jobs_dir.is_dir()
            else f"jobs directory {where} does not exist"
        )
        return ProjectState(ProjectStateName.NO_JOBS, [reason])

    if active:
        return _active_state(config, active, gaps)

    if gaps:
        return ProjectState(ProjectStateName.UNKNOWN, gaps)
    return ProjectState(
        ProjectStateName.ALL_DISABLED, [f"all {len(jobs)} definition(s) have enabled=False"]
    )


def _active_state(config: DocsConfig, active: list[JobEvidence], gaps: list[str]) -> ProjectState:
    """The state of a project with active definitions: it hangs on the switch and Redis."""
    switch = config.jobs_enabled
    labels = sorted(_label(job) for job in active)
    names = ", ".join(labels[:_NAMED_ACTIVE])
    if len(labels) > _NAMED_ACTIVE:
        names += f", and {len(labels) - _NAMED_ACTIVE} more (every job is listed under jobs)"
    found = f"{len(active)} active definition(s): {names}"
    if not switch.known:
        lead = f"jobs_enabled is not statically known: {switch.source}"
        return ProjectState(ProjectStateName.UNKNOWN, [lead, found, *gaps])
    lead = f"jobs_enabled is true ({switch.source})"
    redis = config.redis_url
    if redis.value is not None:
        state, redis_reason = ProjectStateName.ACTIVE, f"Redis configured by {redis.source}"
    elif not redis.known:
        state = ProjectStateName.UNKNOWN
        redis_reason = f"Redis configuration is not statically known: {redis.source}"
    else:
        state = ProjectStateName.ACTIVE_WITHOUT_REDIS
        redis_reason = f"no Redis configured: {redis.source} and PLATFORM_REDIS_URL is not set"
    return ProjectState(state, [lead, found, redis_reason, *gaps])
