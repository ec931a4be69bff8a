"""``tests.apps.jobs_app`` with a pause in beat's first publish
(:mod:`tests.support.publish_pause`), for the warm-stop tests: they signal beat while
it holds admitted points whose triggers are not sent yet."""

from __future__ import annotations

import logging

from platform_tasks import create_app
from tests.support.publish_pause import install_publish_pause

logging.getLogger("platform_tasks.jobs.points").setLevel(logging.DEBUG)

app = create_app("paused_jobs_app")
install_publish_pause(app)
