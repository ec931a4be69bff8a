"""One static run over a project: select, read, cross-check, summarise.

This is the only place that knows the order of the steps; each step lives in its own
module so it can be tested on its own.
"""

from __future__ import annotations

import gc
import os
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from platform_tasks.jobdocs.analysis import FileAnalysis, analyse_file
from platform_tasks.jobdocs.config import DocsConfig
from platform_tasks.jobdocs.evidence import (
    FieldState,
    FileWithoutEvidence,
    JobEvidence,
    Problem,
    Report,
    Severity,
)
from platform_tasks.jobdocs.parallel import (
    PARALLEL_MIN_FILES,
    analyse_in_processes,
    default_workers,
)
from platform_tasks.jobdocs.project_state import project_state
from platform_tasks.jobdocs.render_json import json_job_renderer
from platform_tasks.jobdocs.render_markdown import markdown_job_renderer
from platform_tasks.jobdocs.resolve import Resolver
from platform_tasks.jobdocs.sources import SourceIndex
from platform_tasks.jobs.selection import select_job_paths

__all__ = ["PARALLEL_MIN_FILES", "build_report", "default_workers"]


def _check_unique_names(jobs: list[JobEvidence]) -> list[int]:
    """Add a problem to every job whose name another job has too; returns their indexes."""
    by_name: dict[str, list[int]] = defaultdict(list)
    for index, job in enumerate(jobs):
        evidence = job.fields["name"]
        if evidence.state is not FieldState.UNKNOWN and isinstance(evidence.value, str):
            by_name[evidence.value].append(index)
    changed: list[int] = []
    for name, indexes in by_name.items():
        if len(indexes) < 2:
            continue
        changed += indexes
        holders = [jobs[index] for index in indexes]
        for job in holders:
            others = ", ".join(
                f"{other.file}:{other.line}" for other in holders if other is not job
            )
            job.problems.append(
                Problem(
                    Severity.ERROR, job.file, f"duplicate name {name!r}, also in {others}", "name"
                )
            )
    return changed


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


JobRenderer = Callable[[JobEvidence], str]

_JOB_RENDERERS: dict[str, Callable[[], JobRenderer]] = {
    "json": json_job_renderer,
    "markdown": markdown_job_renderer,
}


def build_report(
    config: DocsConfig, *, workers: int | None = None, prerender: str | None = None
) -> Report:
    """Read every selected job file of ``config`` statically and summarise the project.

    ``workers`` is the number of processes that read the files: ``None`` picks one per
    available core when at least :data:`PARALLEL_MIN_FILES` files are selected (where
    ``fork`` exists), ``1`` keeps everything in this process. The report is the same
    either way: each file is analysed on its own, and results are merged in file order.

    ``prerender`` (``"json"`` or ``"markdown"``) has each process also write the entries
    of the jobs it read in that format, so rendering a large report is mostly joining
    (see ``Report.prerendered``); the rendered output is the same.
    """
    if prerender is not None and prerender not in _JOB_RENDERERS:
        raise ValueError(f"prerender must be one of {sorted(_JOB_RENDERERS)}, not {prerender!r}")
    with _cycle_collector_paused():
        return _build_report(config, workers, prerender)


def _label(root: str, file: str) -> str:
    """:func:`platform_tasks.jobs.selection.path_label` for a file that
    :func:`select_job_paths` returned for ``root`` (absolute, below it, ending in
    ``.py``), with string operations instead of ``Path.relative_to``."""
    return file[len(root) + 1 : -3].replace(os.sep, ".")


def _analyse_chunk(resolver: Resolver, root: str, files: Sequence[str]) -> list[FileAnalysis]:
    """Analyses in file order, with their cron checks still pending (see
    :func:`_settle`)."""
    results: list[FileAnalysis] = []
    for file in files:
        results.append(analyse_file(resolver, file, _label(root, file), defer_cron=True))
        resolver.forget(file)
    return results


def _settle(analyses: list[FileAnalysis], renderer: JobRenderer | None) -> list[FileAnalysis]:
    """Run the cron checks the analyses left pending, in this process (a project repeats
    a few expressions across many files, and each is checked once), then render the
    jobs that have no text yet or gained a problem."""
    for analysis in analyses:
        changed = analysis.settle_crons() if analysis.pending_crons else []
        if renderer is None:
            continue
        if analysis.texts is None:
            analysis.texts = [renderer(job) for job in analysis.jobs]
        else:
            for index in changed:
                analysis.texts[index] = renderer(analysis.jobs[index])
    return analyses


def _prerender(analyses: list[FileAnalysis], renderer: JobRenderer | None) -> None:
    """Render jobs whose cron checks are still pending (a child's): :func:`_settle`
    re-renders any that gain a problem."""
    if renderer is not None:
        for analysis in analyses:
            analysis.texts = [renderer(job) for job in analysis.jobs]


def _build_report(config: DocsConfig, workers: int | None, prerender: str | None) -> Report:
    renderer = None if prerender is None else _JOB_RENDERERS[prerender]()
    index = SourceIndex(config.project_dir, list(config.source_roots))
    resolver = Resolver(index)
    listed = index.python_files(config.jobs_dir)
    files = select_job_paths(config.jobs_dir, config.include, config.exclude, candidates=listed)
    root = str(config.jobs_dir.absolute())
    count = default_workers(len(files)) if workers is None else max(1, workers)
    count = min(count, len(files))
    if count > 1:
        analyses = analyse_in_processes(
            files,
            count,
            lambda batch: _analyse_chunk(resolver, root, batch),
            prepare=lambda batch: _prerender(batch, renderer),
            finish=lambda batch: _settle(batch, renderer),
        )
    else:
        analyses = _settle(_analyse_chunk(resolver, root, files), renderer)
    jobs: list[JobEvidence] = []
    texts: list[str] = []
    without: list[FileWithoutEvidence] = []
    problems: list[Problem] = []
    for analysis in analyses:
        jobs.extend(analysis.jobs)
        if analysis.texts is not None:
            texts.extend(analysis.texts)
        problems.extend(analysis.problems)
        if analysis.without_evidence is not None:
            without.append(analysis.without_evidence)
    for position in _check_unique_names(jobs):
        if renderer is not None:
            texts[position] = renderer(jobs[position])
    for job in jobs:
        if job.problems:
            problems.extend(job.problems)
        if job.gaps:
            problems.extend(Problem(Severity.WARNING, job.file, gap) for gap in job.gaps)
    return Report(
        profile=config.profile,
        project=project_state(config, jobs, without),
        jobs=jobs,
        files_without_evidence=without,
        # A file-level problem is attached to each of its definitions; report it once.
        problems=list(dict.fromkeys(problems)),
        prerendered=None if prerender is None else (prerender, texts),
    )
