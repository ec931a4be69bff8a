"""A stand-alone delay promoter process for fault tests: ``python -m tests.support.promoter_main``.

It runs the production promoter loop (``DelayPromoter``) until killed, with settings from
the environment like any worker would.
"""

from __future__ import annotations

import signal
import sys
import threading

from platform_tasks.publishing.delay_promoter import DelayPromoter
from platform_tasks.settings import PlatformSettings


def main() -> None:
    promoter = DelayPromoter(PlatformSettings.from_env())
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    promoter.start()
    print("promoter started", flush=True)
    stopped.wait()
    promoter.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
