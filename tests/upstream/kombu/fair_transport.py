"""The platform transport with every queue fair, for ``TEST_FAIR_QUEUES`` runs of the
upstream suite (its connections take no transport options of ours)."""

from __future__ import annotations

import os
from typing import Any

from platform_tasks.brokers.transport import Transport as PlatformTransport
from platform_tasks.brokers.transport.channel import Channel as PlatformChannel
from tests.support.processes import FAIR_SWITCH

PATH = "tests.upstream.kombu.fair_transport:Transport"


class Channel(PlatformChannel):
    def __init__(self, connection: Any, *args: Any, **kwargs: Any) -> None:
        options = connection.client.transport_options
        options.setdefault("fair_queues", [os.environ.get(FAIR_SWITCH) or "*"])
        super().__init__(connection, *args, **kwargs)


class Transport(PlatformTransport):
    Channel = Channel
