"""Unmanaged models over the platform's tables in schema ``core``.

``managed = False``: Django never creates, alters or drops these tables; their schema
belongs to the platform's migrations (``platform-tasks migrate``). The app's Django
migration only records the models, so that content types and the console's permissions
exist. ``db_table`` names the schema explicitly (``core"."dead_letters`` is quoted by
Django as ``"core"."dead_letters"``), so the console's own tables can live in another
schema through ``search_path`` without hiding these.

``Queue`` has no table: it anchors the queues page and the queue permissions in the admin.
``Batch`` anchors the batches pages and their permission; the pages read
:mod:`platform_tasks.batches.status` (the read model ``platform-tasks batches`` uses).

``LoginFailures`` is the one managed model: the login throttle's counts, kept with the
console's own tables (schema ``console``, or a mounted project's ``default`` database)
so that every console process sees the same counts.
"""

from __future__ import annotations

from django.db import models

from platform_tasks.contrib.django import permissions

__all__ = ["Batch", "DeadLetter", "LoginFailures", "Operation", "Queue"]

STATUS_CHOICES = [
    ("pending_review", "pending review"),
    ("replayed", "replayed"),
    ("discarded", "discarded"),
]


class DeadLetter(models.Model):
    """One row of ``core.dead_letters``."""

    id = models.BigIntegerField(primary_key=True)
    job_id = models.UUIDField(null=True)
    queue = models.TextField(null=True)
    kind = models.TextField(null=True)
    tenant_id = models.TextField("tenant", null=True)
    payload = models.JSONField()
    attempts = models.IntegerField()
    last_error = models.TextField("error", null=True)
    error_type = models.TextField("error type", null=True)
    reason = models.TextField()
    status = models.TextField(choices=STATUS_CHOICES)
    correlation_id = models.TextField(null=True)
    created_at = models.DateTimeField("dead-lettered at")
    updated_at = models.DateTimeField()
    replay_count = models.IntegerField()
    replayed_at = models.DateTimeField(null=True)
    discard_reason = models.TextField(null=True)
    discarded_at = models.DateTimeField(null=True)

    class Meta:
        managed = False
        db_table = 'core"."dead_letters'
        ordering = ["-created_at", "-id"]
        verbose_name = "dead letter"
        default_permissions = ("view",)
        permissions = [
            (permissions.VIEW_PAYLOAD, "Can see the payload data of dead letters"),
            (permissions.REPLAY_DEAD_LETTERS, "Can replay dead letters"),
            (permissions.DISCARD_DEAD_LETTERS, "Can discard dead letters"),
        ]

    def __str__(self) -> str:
        return f"dead letter {self.id} ({self.kind or 'unknown kind'})"


class Operation(models.Model):
    """One row of ``core.operations``: who ran which bulk operation, on what, with what end."""

    id = models.BigIntegerField(primary_key=True)
    actor = models.TextField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True)
    kind = models.TextField()
    filter = models.JSONField()
    matched = models.BigIntegerField()
    done = models.BigIntegerField()
    failed = models.BigIntegerField()
    outcome = models.TextField()
    last_id = models.BigIntegerField()
    max_id = models.BigIntegerField(null=True)
    detail = models.TextField(null=True)

    class Meta:
        managed = False
        db_table = 'core"."operations'
        ordering = ["-id"]
        verbose_name = "operation"
        default_permissions = ("view",)

    def __str__(self) -> str:
        return f"operation {self.id} ({self.kind} by {self.actor})"


class Queue(models.Model):
    """No table: the queues page (depths, paused queues) and its permissions."""

    name = models.TextField(primary_key=True)

    class Meta:
        managed = False
        db_table = 'core"."no_such_table_console_queues'
        verbose_name = "queue"
        default_permissions = ("view",)
        permissions = [
            (permissions.PAUSE_QUEUES, "Can pause and resume queues"),
            (permissions.CANCEL_JOBS, "Can cancel waiting jobs"),
        ]

    def __str__(self) -> str:
        return str(self.name)


class Batch(models.Model):
    """One row of ``core.batches``: the batches pages (counts come from the read model)."""

    batch_id = models.UUIDField(primary_key=True)
    description = models.TextField()
    created_at = models.DateTimeField()

    class Meta:
        managed = False
        db_table = 'core"."batches'
        ordering = ["-created_at"]
        verbose_name = "batch"
        verbose_name_plural = "batches"
        default_permissions = ("view",)

    def __str__(self) -> str:
        return f"batch {self.batch_id}"


class LoginFailures(models.Model):
    """Failed logins of one throttle key (a client address, or an address and a user name)
    in the current window; see :mod:`platform_tasks.contrib.django.login_throttle`.

    ``key`` is a SHA-256 of the address and the name typed: a password typed into the
    user name field is never stored."""

    key = models.CharField(primary_key=True, max_length=80)
    failures = models.IntegerField()
    window_started = models.DateTimeField(db_index=True)
    locked_until = models.DateTimeField(null=True)

    class Meta:
        verbose_name = "login failures"
        verbose_name_plural = "login failures"
        default_permissions = ()

    def __str__(self) -> str:
        return f"{self.failures} failed logins since {self.window_started}"
