"""Publishing a batch of envelopes in one Redis round trip, as ``QueuePort.publish`` would.

A loop of ``publish`` costs one ``send_task`` (routing, header building, serialization)
and one round trip per message. A fan-out publishes the same kind to the same queue for
every tenant, so the first message of a batch is built by Celery's own ``send_task``
(captured, not sent: :class:`~platform_tasks.publishing.wire.WireBuilder`), and the rest are that
message with the fields that differ per job replaced: the task id (header ``id``, property
``correlation_id``, and ``root_id`` when it is the task's own id), the redacted
``argsrepr`` (a header and a property), a fresh delivery tag and the body. One
``LPUSH`` with every message of a batch then puts them on the queue's list over one
connection.

The template is checked against what it must be (JSON body, base64 body encoding, the
body decoding to the envelope sent); a broker or serializer set-up that does not match
falls back to building every message through ``send_task`` (slower, same bytes). Per-job
``task-sent`` events are not emitted for batched messages; Flower shows each job once a
worker receives it.
"""

from __future__ import annotations

import base64
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import redis
from kombu.serialization import dumps as kombu_dumps
from kombu.utils.json import dumps as json_dumps
from kombu.utils.json import loads as json_loads

from platform_tasks.brokers.transport.fair_lanes import waiting_in_lanes
from platform_tasks.envelope import Envelope
from platform_tasks.errors import ConfigurationError
from platform_tasks.fanout.backpressure import QueueBound
from platform_tasks.headers import (
    ATTEMPT_HEADER,
    PUBLISH_TIME_HEADER,
    PUBLISHED_AT_HEADER,
    TENANT_HEADER,
)
from platform_tasks.observability.trace_context import (
    outgoing_headers,
)
from platform_tasks.publishing.outbox_waiting import OutboxWaiting
from platform_tasks.publishing.reference_clock import shared_clock
from platform_tasks.publishing.wire import WireBuilder, WireMessage

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = ["BatchPublisher", "TenantPublisher"]

logger = logging.getLogger("platform_tasks.fanout")


def send_task_options(
    queue: str,
    envelope: Envelope[Any],
    publish_time: float | None = None,
    headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The ``send_task`` arguments ``QueuePort.publish`` uses for ``envelope``;
    ``publish_time`` on the reference clock (:mod:`~platform_tasks.publishing.reference_clock`);
    ``headers``: the same for every job of the fan-out (its batch's header)."""
    return {
        "args": [envelope.to_message()],
        "task_id": str(envelope.job_id),
        "queue": queue,
        "argsrepr": _argsrepr(envelope),
        "kwargsrepr": "{}",
        "headers": {
            **outgoing_headers({}, published_at=time.time(), publish_time=publish_time),
            ATTEMPT_HEADER: 1,
            TENANT_HEADER: envelope.tenant_id,
            **(headers or {}),
        },
    }


class TenantPublisher(Protocol):
    """What the fan-out consumer publishes a batch with, whatever the broker."""

    def publish(self, envelopes: Sequence[Envelope[Any]]) -> None: ...

    def close(self) -> None: ...


class _Template:
    """A wire message of the batch's kind and queue, with the per-job fields replaceable.

    The fields to replace are found by value: every header or property equal to the
    template's job id or to its ``argsrepr``. The template proves itself before use:
    rendered for its own envelope, it must reproduce the message ``send_task`` built,
    apart from the delivery tag.
    """

    def __init__(self, built: WireMessage, envelope: Envelope[Any]) -> None:
        message = json_loads(built.wire)
        self.list_key = built.list_key
        self.message = message
        job_id = str(envelope.job_id)
        argsrepr = _argsrepr(envelope)
        headers, props = message["headers"], message["properties"]
        if (
            message.get("content-type") != "application/json"
            or message.get("content-encoding") != "utf-8"
            or props.get("body_encoding") != "base64"
        ):
            raise ValueError("message shape differs from the JSON/base64 wire format")
        body = json_loads(base64.b64decode(message["body"]))
        if not (
            isinstance(body, list)
            and len(body) == 3
            and body[0] == [envelope.to_message()]
            and body[1] == {}
        ):
            raise ValueError("message body differs from [[envelope], {}, embed]")
        self.embed = body[2]
        self.id_headers = [key for key, value in headers.items() if value == job_id]
        self.id_props = [key for key, value in props.items() if value == job_id]
        self.repr_headers = [key for key, value in headers.items() if value == argsrepr]
        self.repr_props = [key for key, value in props.items() if value == argsrepr]
        if "id" not in self.id_headers or "correlation_id" not in self.id_props:
            raise ValueError("task id not found where Celery puts it")
        stamped = headers.get(PUBLISH_TIME_HEADER)
        again = json_loads(self.render(envelope, stamped if isinstance(stamped, float) else None))
        again["properties"]["delivery_tag"] = props.get("delivery_tag")
        for stamped in (PUBLISHED_AT_HEADER, PUBLISH_TIME_HEADER):
            if stamped in headers:
                again["headers"][stamped] = headers[stamped]
        if again != message:
            raise ValueError("the rendered template differs from the message send_task built")

    def render(self, envelope: Envelope[Any], publish_time: float | None = None) -> str:
        job_id = str(envelope.job_id)
        argsrepr = _argsrepr(envelope)
        message = dict(self.message)
        headers = dict(message["headers"])
        props = dict(message["properties"])
        props["delivery_info"] = dict(props["delivery_info"])
        for key in self.id_headers:
            headers[key] = job_id
        for key in self.id_props:
            props[key] = job_id
        for key in self.repr_headers:
            headers[key] = argsrepr
        if TENANT_HEADER in headers:
            headers[TENANT_HEADER] = envelope.tenant_id
        for key in self.repr_props:
            props[key] = argsrepr
        props["delivery_tag"] = str(uuid.uuid4())
        now = time.time()
        if PUBLISHED_AT_HEADER in headers:  # each child's own ready time, for queue latency
            headers[PUBLISHED_AT_HEADER] = now
        if PUBLISH_TIME_HEADER in headers:  # and its own publish time, for cancel rules
            headers[PUBLISH_TIME_HEADER] = now if publish_time is None else publish_time
        _, _, payload = kombu_dumps([[envelope.to_message()], {}, self.embed], serializer="json")
        raw = payload.encode() if isinstance(payload, str) else payload
        message["body"] = base64.b64encode(raw).decode()
        message["headers"] = headers
        message["properties"] = props
        return str(json_dumps(message))


def _argsrepr(envelope: Envelope[Any]) -> str:
    return f"({envelope.redacted()})"


class BatchPublisher:
    """Publishes batches of envelopes of one kind to one queue over one connection."""

    def __init__(
        self,
        app: PlatformCelery,
        *,
        queue: str,
        bound: QueueBound | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.app = app
        self.queue = queue
        self.bound = bound
        self.headers = dict(headers or {})
        self._wire = WireBuilder(app)
        self._connection = app.connection_for_write()
        channel = self._connection.default_channel
        pool = getattr(channel, "pool", None)
        if pool is None or not hasattr(channel, "_q_for_pri"):
            self._connection.release()
            raise ConfigurationError(
                "fan-out publishes on a Redis or RabbitMQ broker (PLATFORM_BROKER_URL); "
                f"got transport {self._connection.transport_cls!r}"
            )
        self._client = redis.Redis(connection_pool=pool)
        self._template: _Template | None = None
        self._fallback = False
        self._reference = shared_clock(app.platform_settings)
        self._outbox = OutboxWaiting(app.platform_settings)
        self.round_trips = 0

    def _wire_of(self, envelope: Envelope[Any], publish_time: float) -> WireMessage:
        return self._wire.build(
            envelope.kind, **send_task_options(self.queue, envelope, publish_time, self.headers)
        )

    def publish(self, envelopes: Sequence[Envelope[Any]]) -> None:
        """Put every envelope on the queue with one ``LPUSH`` per target list."""
        if not envelopes:
            return
        by_list: dict[str, list[str]] = {}
        start = 0
        stamp = self._reference.now()  # the batch's publish time
        if self._template is None and not self._fallback:
            built = self._wire_of(envelopes[0], stamp)
            by_list.setdefault(built.list_key, []).append(built.wire)
            start = 1
            try:
                self._template = _Template(built, envelopes[0])
            except (ValueError, KeyError, TypeError) as exc:
                self._fallback = True
                logger.warning(
                    "fan-out to %s builds every message through send_task (slower): %s",
                    self.queue,
                    exc,
                    extra={"event": "fanout.unbatched", "queue": self.queue},
                )
        for envelope in envelopes[start:]:
            if self._template is not None:
                by_list.setdefault(self._template.list_key, []).append(
                    self._template.render(envelope, stamp)
                )
            else:
                built = self._wire_of(envelope, stamp)
                by_list.setdefault(built.list_key, []).append(built.wire)
        if self.bound is not None:
            keys = list(by_list)
            self.bound.wait_for_room(self.queue, lambda: self._depth(keys), len(envelopes))
        pipe = self._client.pipeline(transaction=False)
        for key, wires in by_list.items():
            pipe.lpush(key, *wires)
        pipe.execute()
        self.round_trips += 1

    def _depth(self, keys: list[str]) -> int:
        """Messages waiting on the lists this batch goes to."""
        pipe = self._client.pipeline(transaction=False)
        for key in keys:
            pipe.llen(key)
        # A fair queue's backlog waits in its tenant lanes, not on the list; committed
        # outbox rows for the queue are on their way to it.
        listed = sum(int(n) for n in pipe.execute()) + waiting_in_lanes(self._client, keys)
        return listed + self._outbox.for_queue(self.queue)

    @property
    def batched(self) -> bool:
        """False when messages are built one by one through ``send_task`` (fallback)."""
        return not self._fallback

    def close(self) -> None:
        self._wire.close()
        self._connection.release()
        self._outbox.close()
