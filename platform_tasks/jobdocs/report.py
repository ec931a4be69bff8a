"""One static run over a project: select, read, cross-check, summarise.

This is the only place that knows the order of the steps; each step lives in its own
module so it can be tested on its own.
"""

from __future__ import annotations

import gc
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

from platform_tasks.jobdocs.analysis import analyse_file
from platform_tasks.jobdocs.config import DocsConfig
from platform_tasks.jobdocs.evidence import (
    FieldState,
    FileWithoutEvidence,
    JobEvidence,
    Problem,
    Report,
    Severity,
)
from platform_tasks.jobdocs.project_state import project_state
from platform_tasks.jobdocs.resolve import Resolver
from platform_tasks.jobdocs.sources import SourceIndex
from platform_tasks.jobs.selection import path_label, select_job_files

__all__ = ["build_report"]


def _check_unique_names(jobs: list[JobEvidence]) -> None:
    by_name: dict[str, list[JobEvidence]] = defaultdict(list)
    for job in jobs:
        evidence = job.fields["name"]
        if evidence.state is not FieldState.UNKNOWN and isinstance(evidence.value, str):
            by_name[evidence.value].append(job)
    for name, holders in by_name.items():
        if len(holders) < 2:
            continue
        for job in holders:
            others = ", ".join(
                f"{other.file}:{other.line}" for other in holders if other is not job
            )
            job.problems.append(
                Problem(
                    Severity.ERROR, job.file, f"duplicate name {name!r}, also in {others}", "name"
                )
            )


@contextmanager
def _cycle_collector_paused() -> Iterator[None]:
    """Parsing allocates hundreds of AST nodes per file, which the cyclic collector would
    scan again and again; they form no reference cycles and are freed by reference
    counting as soon as a file is done, so the collector is paused for the run."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def build_report(config: DocsConfig) -> Report:
    """Read every selected job file of ``config`` statically and summarise the project."""
    with _cycle_collector_paused():
        return _build_report(config)


def _build_report(config: DocsConfig) -> Report:
    index = SourceIndex(config.project_dir, list(config.source_roots))
    resolver = Resolver(index)
    jobs: list[JobEvidence] = []
    without: list[FileWithoutEvidence] = []
    problems: list[Problem] = []
    for file in select_job_files(config.jobs_dir, config.include, config.exclude):
        analysis = analyse_file(resolver, file, path_label(config.jobs_dir, file))
        resolver.forget(file)
        jobs.extend(analysis.jobs)
        problems.extend(analysis.problems)
        if analysis.without_evidence is not None:
            without.append(analysis.without_evidence)
    _check_unique_names(jobs)
    for job in jobs:
        problems.extend(job.problems)
        problems.extend(Problem(Severity.WARNING, job.file, gap) for gap in job.gaps)
    return Report(
        profile=config.profile,
        project=project_state(config, jobs, without),
        jobs=jobs,
        files_without_evidence=without,
        # A file-level problem is attached to each of its definitions; report it once.
        problems=list(dict.fromkeys(problems)),
    )
