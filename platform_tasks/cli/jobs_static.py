"""``platform-tasks schedules docs`` and ``schedules check --static``: job evidence without imports.

Both commands read the job files with the static reader only, so they are safe to run
in CI and on a reviewer's laptop without secrets, services or the project's
dependencies installed.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from platform_tasks.jobdocs import (
    DocsConfig,
    DocsConfigError,
    Report,
    SelectionOverrides,
    build_report,
    default_profile,
    load_docs_config,
    render_json,
    render_markdown,
)

__all__ = ["check", "docs"]

_profile_option = click.option(
    "--profile",
    default=None,
    help="Profile whose settings apply (default: $PLATFORM_PROFILE, else development).",
)
_project_option = click.option(
    "--project",
    "project_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Project directory holding pyproject.toml.",
)


def _load(
    project_dir: Path, profile: str | None, overrides: SelectionOverrides | None = None
) -> DocsConfig:
    environ = dict(os.environ)
    try:
        return load_docs_config(
            project_dir, profile or default_profile(environ), environ, overrides
        )
    except DocsConfigError as exc:
        raise click.ClickException(str(exc)) from exc


@click.command()
@_profile_option
@_project_option
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["markdown", "json"]),
    default="markdown",
    show_default=True,
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write to this file instead of standard output.",
)
@click.option(
    "--dir",
    "docs_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Jobs directory to document (overrides docs_dir and the inherited jobs_dir).",
)
@click.option("--include", multiple=True, help="Include glob; replaces docs_include/jobs_include.")
@click.option("--exclude", multiple=True, help="Exclude glob; replaces docs_exclude/jobs_exclude.")
def docs(
    profile: str | None,
    project_dir: Path,
    output_format: str,
    output: Path | None,
    docs_dir: Path | None,
    include: tuple[str, ...],
    exclude: tuple[str, ...],
) -> None:
    """Document scheduled jobs from source, without importing any project module."""
    overrides = SelectionOverrides(dir=docs_dir, include=include or None, exclude=exclude or None)
    report = build_report(_load(project_dir, profile, overrides), prerender=output_format)
    text = render_json(report) if output_format == "json" else render_markdown(report)
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
    _echo_problems(report, errors=False)


def _echo_problems(report: Report, *, errors: bool) -> None:
    if errors:
        for problem in report.errors:
            click.echo(problem.render(), err=True)
    for problem in report.warnings:
        click.echo(problem.render(), err=True)


@click.command()
@_profile_option
@_project_option
@click.option(
    "--static",
    "static",
    is_flag=True,
    help="Check declarations from source only (the only mode available here).",
)
def check(profile: str | None, project_dir: Path, static: bool) -> None:
    """Fail (exit 1) on schedule errors found statically; warn about missing evidence."""
    if not static:
        raise click.UsageError(
            "only static checking is available: pass --static "
            "(start-up validation happens when beat or a worker starts)"
        )
    report = build_report(_load(project_dir, profile))
    _echo_problems(report, errors=True)
    files = len({job.file for job in report.jobs} | {f.file for f in report.files_without_evidence})
    click.echo(
        f"checked {len(report.jobs)} definition(s) in {files} file(s) for profile "
        f"{report.profile!r}: {len(report.errors)} error(s), {len(report.warnings)} "
        f"warning(s); project state {report.project.state.value} (runtime_verified: false)"
    )
    if report.errors:
        click.get_current_context().exit(1)
