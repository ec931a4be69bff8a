"""``python -m platform_tasks.cli`` is the console script."""

from platform_tasks.cli import run

run()
