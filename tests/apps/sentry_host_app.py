"""The consumer test app inside a host application that initialised Sentry itself.

The host calls ``sentry_sdk.init`` with its own DSN (``HOST_SENTRY_DSN``) before the
platform is imported, with sentry-sdk's defaults (logging integration on, local variables
of frames included) plus ``CeleryIntegration``, as a Celery project typically does. The
platform must send through this client, never initialise its own over it.
"""

from __future__ import annotations

import os

import sentry_sdk
from sentry_sdk.integrations.celery import CeleryIntegration

sentry_sdk.init(dsn=os.environ["HOST_SENTRY_DSN"], integrations=[CeleryIntegration()])

from tests.apps.consumer_app import app, apply_work  # noqa: E402

__all__ = ["app", "apply_work"]
