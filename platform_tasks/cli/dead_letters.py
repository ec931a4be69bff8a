"""``platform-tasks dead-letters``: list, show, replay and discard dead-lettered jobs."""

from __future__ import annotations

import click


@click.group("dead-letters")
def dead_letters() -> None:
    """Review and act on rows of core.dead_letters."""
