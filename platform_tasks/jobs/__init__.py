"""Scheduled job definitions (``define_job``) and their discovery from ``beat_schedules/``."""

from __future__ import annotations

from platform_tasks.jobs.definition import JobDefinition, define_job
from platform_tasks.jobs.runner import JobContext

__all__ = ["JobContext", "JobDefinition", "define_job"]
