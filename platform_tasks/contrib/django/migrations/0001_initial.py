"""The console's models, recorded for Django only: every one is unmanaged (``core`` belongs
to ``platform-tasks migrate``; ``Queue`` has no table), so this migration creates nothing
in the database. It exists so that content types and the console's permissions are made.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="DeadLetter",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("job_id", models.UUIDField(null=True)),
                ("queue", models.TextField(null=True)),
                ("kind", models.TextField(null=True)),
                ("tenant_id", models.TextField(null=True, verbose_name="tenant")),
                ("payload", models.JSONField()),
                ("attempts", models.IntegerField()),
                ("last_error", models.TextField(null=True, verbose_name="error")),
                ("error_type", models.TextField(null=True, verbose_name="error type")),
                ("reason", models.TextField()),
                (
                    "status",
                    models.TextField(
                        choices=[
                            ("pending_review", "pending review"),
                            ("replayed", "replayed"),
                            ("discarded", "discarded"),
                        ]
                    ),
                ),
                ("correlation_id", models.TextField(null=True)),
                ("created_at", models.DateTimeField(verbose_name="dead-lettered at")),
                ("updated_at", models.DateTimeField()),
                ("replay_count", models.IntegerField()),
                ("replayed_at", models.DateTimeField(null=True)),
                ("discard_reason", models.TextField(null=True)),
                ("discarded_at", models.DateTimeField(null=True)),
            ],
            options={
                "verbose_name": "dead letter",
                "db_table": 'core"."dead_letters',
                "ordering": ["-created_at", "-id"],
                "permissions": [
                    ("view_dead_letter_payload", "Can see the payload data of dead letters"),
                    ("replay_dead_letters", "Can replay dead letters"),
                    ("discard_dead_letters", "Can discard dead letters"),
                ],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
        migrations.CreateModel(
            name="Operation",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("actor", models.TextField()),
                ("started_at", models.DateTimeField()),
                ("finished_at", models.DateTimeField(null=True)),
                ("kind", models.TextField()),
                ("filter", models.JSONField()),
                ("matched", models.BigIntegerField()),
                ("done", models.BigIntegerField()),
                ("failed", models.BigIntegerField()),
                ("outcome", models.TextField()),
                ("last_id", models.BigIntegerField()),
                ("max_id", models.BigIntegerField(null=True)),
                ("detail", models.TextField(null=True)),
            ],
            options={
                "verbose_name": "operation",
                "db_table": 'core"."operations',
                "ordering": ["-id"],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
        migrations.CreateModel(
            name="Queue",
            fields=[
                ("name", models.TextField(primary_key=True, serialize=False)),
            ],
            options={
                "verbose_name": "queue",
                "db_table": 'core"."no_such_table_console_queues',
                "permissions": [
                    ("pause_queues", "Can pause and resume queues"),
                    ("cancel_jobs", "Can cancel waiting jobs"),
                ],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
    ]
