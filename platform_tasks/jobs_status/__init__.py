"""Job status: where one job is, a running job's progress, a handler's recorded output.

One state of waiting, delayed, running, applied, dead-lettered, cancelled, unknown, read
from the stores the platform keeps anyway.

Not to be confused with :mod:`platform_tasks.jobs` (scheduled job *definitions*) or
:mod:`platform_tasks.consumer.job_state` (a delivery's attempt counts). See
``docs/job-status.md`` for what each answer can and cannot know.
"""

from __future__ import annotations

from platform_tasks.jobs_status.lookup import StatusReader, job_status, jobs_of_correlation
from platform_tasks.jobs_status.model import STATES, JobStatus, State
from platform_tasks.jobs_status.output import read_outputs
from platform_tasks.jobs_status.running import report_progress

__all__ = [
    "STATES",
    "JobStatus",
    "State",
    "StatusReader",
    "job_status",
    "jobs_of_correlation",
    "read_outputs",
    "report_progress",
]
