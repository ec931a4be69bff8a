"""``platform-tasks jobs``: the runtime listing and the static docs/check commands."""

from __future__ import annotations

import click


@click.group()
def jobs() -> None:
    """Inspect scheduled job definitions (runtime listing or static evidence)."""
