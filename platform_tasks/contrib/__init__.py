"""Integrations with tools Celery teams already run (installed with extras).

``django_celery_beat``: :class:`LeaseDatabaseScheduler`, django-celery-beat's database
scheduler with the platform's admission rules (extra ``django``).
"""
