"""``platform-tasks dev``: run the whole platform locally on embedded servers."""

from __future__ import annotations

import click


@click.command()
def dev() -> None:
    """Start Redis, PostgreSQL, a worker, beat replicas and Flower; Ctrl-C stops them all."""
    raise click.ClickException("not available yet")
