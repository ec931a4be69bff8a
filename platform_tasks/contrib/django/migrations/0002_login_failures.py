"""The login throttle's counts (:class:`~platform_tasks.contrib.django.models.LoginFailures`):
the console's one table of its own, created where Django's auth tables are (schema
``console`` of the standalone console, a mounted project's ``default`` database), never
in the platform's schema ``core``.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("platform_console", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="LoginFailures",
            fields=[
                ("key", models.CharField(max_length=80, primary_key=True, serialize=False)),
                ("failures", models.IntegerField()),
                ("window_started", models.DateTimeField(db_index=True)),
                ("locked_until", models.DateTimeField(null=True)),
            ],
            options={
                "verbose_name": "login failures",
                "verbose_name_plural": "login failures",
                "default_permissions": (),
            },
        ),
    ]
