"""platform-tasks schedules: scheduled job definitions (list, docs, check).

Apart from ``platform-tasks jobs``, which is about job *instances* (``show``, ``list
--correlation-id``, ``cancel``).

``list`` discovers the definitions as a worker would (their leases and next points);
``docs`` and ``check`` read them with the static reader only. The same commands under
their old names (``jobs docs``, ``jobs check``, ``jobs list`` without
``--correlation-id``) keep working for this release and print a notice on stderr.
"""

from __future__ import annotations

from typing import Any

import click

from platform_tasks.cli import LazyGroup

__all__ = ["notice", "old_check", "old_docs", "renamed", "schedules"]


@click.group(
    cls=LazyGroup,
    lazy_commands={
        "check": "platform_tasks.cli.jobs_static:check",
        "docs": "platform_tasks.cli.jobs_static:docs",
        "list": "platform_tasks.cli.jobs_runtime:list_jobs",
    },
)
def schedules() -> None:
    """Scheduled job definitions: list them with their next points, document them, check
    them statically."""


def notice(old: str, new: str) -> None:
    """The one-line notice an old command name prints on stderr."""
    click.echo(
        f"notice: `platform-tasks {old}` is now `platform-tasks {new}` "
        "(scheduled job definitions); the old name will be removed in a later release",
        err=True,
    )


def renamed(command: click.Command, old: str, new: str) -> click.Command:
    """``command`` under its old name: the same options, the notice on stderr first."""
    callback = command.callback
    assert callback is not None

    def run(*args: Any, **kwargs: Any) -> Any:
        notice(old, new)
        return callback(*args, **kwargs)

    return click.Command(
        command.name,
        params=command.params,
        callback=run,
        help=f"Now `platform-tasks {new}`. {command.help or ''}",
    )


def _old(name: str) -> click.Command:
    from platform_tasks.cli import jobs_static

    command = getattr(jobs_static, name)
    assert isinstance(command, click.Command)
    return renamed(command, f"jobs {name}", f"schedules {name}")


old_docs = _old("docs")
old_check = _old("check")
