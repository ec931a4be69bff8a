"""The sentry-sdk majors the platform supports, for tests that run a worker under each.

The venv holds the newest release the dependency range allows (3.x); ``scripts/bootstrap``
keeps the newest 2.x beside it in ``.venv/compat/sentry-sdk-2``. A worker started with that
folder first on ``PYTHONPATH`` imports 2.x. Tests parametrised over :data:`SDK_MAJORS`
check the release the worker really sent with (the ``sdk`` field of its events).
"""

from __future__ import annotations

import sys
from pathlib import Path

SDK_MAJORS = ("3", "2")
"""Majors tested: the venv's own (3) and the compat copy (2)."""

COMPAT_DIR = Path(sys.prefix) / "compat" / "sentry-sdk-2"


def sdk_pythonpath(major: str) -> list[Path]:
    """What to put first on ``PYTHONPATH`` for a worker that must import ``major``."""
    if major == "3":
        return []
    if not (COMPAT_DIR / "sentry_sdk").is_dir():
        raise AssertionError(
            f"sentry-sdk 2.x is not installed in {COMPAT_DIR}: run ./scripts/bootstrap "
            "(make test does) to install it"
        )
    return [COMPAT_DIR]


def sent_with(event: dict[str, object]) -> str:
    """The sentry-sdk major that sent ``event`` (its ``sdk.version``)."""
    sdk = event.get("sdk")
    version = sdk.get("version", "") if isinstance(sdk, dict) else ""
    return str(version).split(".", 1)[0]
