"""``platform-tasks jobs``: the runtime listing and the static docs/check commands."""

from __future__ import annotations

import click


@click.group()
def jobs() -> None:
    """Inspect scheduled job definitions (runtime listing or static evidence)."""


from platform_tasks.cli.jobs_static import check as static_check  # noqa: E402
from platform_tasks.cli.jobs_static import docs as static_docs  # noqa: E402

jobs.add_command(static_docs)
jobs.add_command(static_check)

from platform_tasks.cli.jobs_runtime import list_jobs  # noqa: E402

jobs.add_command(list_jobs)
