"""An app for ``LeaseDatabaseScheduler`` with a pause in beat's first publish
(:mod:`tests.support.publish_pause`), for the warm-stop tests. Each admission outcome is
logged at DEBUG (logger ``platform_tasks.contrib.django_celery_beat``) so the tests know
which points were admitted."""

from __future__ import annotations

import logging

from platform_tasks import create_app
from tests.support.publish_pause import install_publish_pause

logging.getLogger("platform_tasks.contrib.django_celery_beat").setLevel(logging.DEBUG)

app = create_app("paused_django_beat_app")
install_publish_pause(app)
