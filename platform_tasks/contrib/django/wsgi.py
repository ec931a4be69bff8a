"""WSGI application of the standalone console (served by waitress: ``platform-tasks console``)."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "platform_tasks.contrib.django.settings")
application = get_wsgi_application()
