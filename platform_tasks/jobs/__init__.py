"""Scheduled job definitions (``define_job``) and their discovery from ``beat_schedules/``.

The public names are imported on first access (PEP 562), like those of
:mod:`platform_tasks`: importing a submodule such as :mod:`platform_tasks.jobs.selection`
(the file rule the static ``jobs docs`` reader shares with beat) runs this ``__init__``,
which therefore must not load the runner and with it redis, sentry_sdk and the settings.
``from platform_tasks.jobs import define_job`` works as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from platform_tasks.lazy import lazy_exports

if TYPE_CHECKING:
    from platform_tasks.jobs.definition import JobDefinition, define_job
    from platform_tasks.jobs.runner import JobContext

__all__ = ["JobContext", "JobDefinition", "define_job"]

_HOMES: dict[str, str] = {
    "JobContext": "platform_tasks.jobs.runner",
    "JobDefinition": "platform_tasks.jobs.definition",
    "define_job": "platform_tasks.jobs.definition",
}
"""Where each public name lives; the module is imported when the name is first used."""


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
