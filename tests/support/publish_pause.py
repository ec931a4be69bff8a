"""A pause inside beat's send loop, so a test can signal beat at a known moment.

``install_publish_pause(app)`` connects Celery's ``before_task_publish`` signal. With
``E2E_PAUSE_FILE`` and ``E2E_RELEASE_FILE`` set, the first message the process publishes
writes the pause file and then waits until the release file exists (at most two minutes).
In beat that moment lies between the admission of a tick's points (their admission
script has run in Redis) and the sending of their triggers: none of the tick's
triggers is on the broker yet. Without the variables nothing is paused.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery.signals import before_task_publish

_HOLD_SECONDS = 120.0
_paused = False


def _pause_first_publish(sender: Any = None, **_: Any) -> None:
    global _paused
    pause, release = os.environ.get("E2E_PAUSE_FILE"), os.environ.get("E2E_RELEASE_FILE")
    if _paused or not pause or not release:
        return
    _paused = True
    Path(pause).write_text(f"{sender}\n")
    deadline = time.monotonic() + _HOLD_SECONDS
    # Polled inside the process under test; the test itself waits on the files.
    while not Path(release).exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def install_publish_pause(app: Any) -> None:
    """Pause the first publish of this process (see the module docstring)."""
    before_task_publish.connect(
        _pause_first_publish, weak=False, dispatch_uid="tests.publish_pause"
    )
