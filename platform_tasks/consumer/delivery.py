"""What a message says about itself apart from the payload, and where it was consumed from.

Retries and replays must go back to the queue the job was consumed from. Celery's
``delivery_info`` carries the exchange and routing key, not the queue, and a queue's name
need not be its routing key (``Queue("ledger", routing_key="ledger.entries")``), so the
queue is found among the app's declared queues by exchange and routing key, then by the
task's own ``queue`` option, and only then taken to be the routing key.

A job that came back through RabbitMQ's native delayed delivery (a retry, a
``schedule()``) arrives from Celery's delayed-delivery exchange with its routing key
prefixed by the countdown's bits (``0.0.….1.billing``): that prefix and that exchange say
nothing about the queue, so both are set aside before the lookup. Without this a delayed
retry lost its queue, and with it the queue's retry policy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kombu.transport.native_delayed_delivery import (
    CELERY_DELAYED_DELIVERY_EXCHANGE,
    MAX_NUMBER_OF_BITS_TO_USE,
)

from platform_tasks.headers import ATTEMPT_HEADER, UNIQUE_HEADER
from platform_tasks.observability.trace_context import carried_headers

_DELAY_PREFIX = re.compile(rf"^(?:[01]\.){{{MAX_NUMBER_OF_BITS_TO_USE}}}")


@dataclass(frozen=True)
class Delivery:
    """One delivery of a job to one consumer (a task name)."""

    consumer: str
    queue: str | None
    header_attempt: Any
    priority: int | None
    payload: Any = None
    """The envelope exactly as received (a copy of the decoded message body, taken before
    the handler runs): what a dead letter keeps for replay, made JSON-safe only when one
    is written."""
    redelivered: bool = False
    """The broker put this message back after an earlier delivery (its worker died)."""
    unique_key: str | None = None
    """The unique publish key the job was published with (released when it starts)."""
    headers: Mapping[str, Any] | None = None
    """Trace context and the publisher's custom headers: what a retry, a throttle and a
    dead letter (for its replay) carry on."""

    @classmethod
    def from_request(cls, task: Any, request: Any, payload: Any = None) -> Delivery:
        info = getattr(request, "delivery_info", None) or {}
        headers = getattr(request, "headers", None) or {}
        attempt = getattr(request, ATTEMPT_HEADER, None)
        if attempt is None and isinstance(headers, Mapping):
            attempt = headers.get(ATTEMPT_HEADER)
        priority = info.get("priority")
        redelivered = bool(info.get("redelivered")) or bool(
            getattr(request, "redelivered", None)
            or (isinstance(headers, Mapping) and headers.get("redelivered"))
        )
        unique = getattr(request, UNIQUE_HEADER, None)
        if unique is None and isinstance(headers, Mapping):
            unique = headers.get(UNIQUE_HEADER)
        return cls(
            consumer=task.name,
            queue=consumed_queue(task, info),
            header_attempt=attempt,
            priority=priority if isinstance(priority, int) else None,
            payload=payload,
            redelivered=redelivered,
            unique_key=unique if isinstance(unique, str) and unique else None,
            headers=carried_headers(request),
        )


def consumed_queue(task: Any, info: Mapping[str, Any]) -> str | None:
    """The declared queue this delivery came from (see the module docstring)."""
    routing_key = info.get("routing_key") or None
    exchange = info.get("exchange")
    if isinstance(exchange, str) and exchange.endswith(CELERY_DELAYED_DELIVERY_EXCHANGE):
        exchange = None
        if routing_key is not None:
            routing_key = _DELAY_PREFIX.sub("", str(routing_key), count=1) or None
    queues: Mapping[str, Any] = getattr(getattr(task.app, "amqp", None), "queues", None) or {}
    if routing_key is not None:
        same_name = queues.get(routing_key)
        if same_name is not None and _same_exchange(same_name, exchange):
            return str(routing_key)
        for name, queue in queues.items():
            if queue.routing_key == routing_key and _same_exchange(queue, exchange):
                return str(name)
    own = getattr(task, "queue", None)
    if isinstance(own, str) and own:
        return own
    return routing_key


def _same_exchange(queue: Any, exchange: Any) -> bool:
    """Whether ``queue`` is bound to ``exchange`` (an unnamed exchange matches any)."""
    name = getattr(getattr(queue, "exchange", None), "name", None)
    return not exchange or not name or name == exchange
