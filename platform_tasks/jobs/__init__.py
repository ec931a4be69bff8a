"""Scheduled job definitions (``define_job``) and their discovery from ``beat_schedules/``."""
