"""App for scheduled-job end-to-end tests: jobs come from PLATFORM_JOBS_DIR."""

from __future__ import annotations

from platform_tasks import create_app

app = create_app("jobs_app")
