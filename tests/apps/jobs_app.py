"""App for scheduled-job end-to-end tests: jobs come from PLATFORM_JOBS_DIR.

Beat logs every considered point at DEBUG (logger ``platform_tasks.jobs.points``); the
end-to-end tests read those lines, so this app turns that one logger on.
"""

from __future__ import annotations

import logging

from platform_tasks import create_app

logging.getLogger("platform_tasks.jobs.points").setLevel(logging.DEBUG)

app = create_app("jobs_app")
