"""The batches pages' model (:class:`~platform_tasks.contrib.django.models.Batch`),
unmanaged like the others over schema ``core``: this migration creates nothing in the
database; it makes the content type and the ``view_batch`` permission exist.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("platform_console", "0002_login_failures")]

    operations = [
        migrations.CreateModel(
            name="Batch",
            fields=[
                ("batch_id", models.UUIDField(primary_key=True, serialize=False)),
                ("description", models.TextField()),
                ("created_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "batch",
                "verbose_name_plural": "batches",
                "db_table": 'core"."batches',
                "ordering": ["-created_at"],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
    ]
