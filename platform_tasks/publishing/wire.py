"""Build the exact broker message Celery would publish, without publishing it.

The delay store keeps delayed jobs as finished wire messages so its promotion script can
push them onto the broker list atomically. Building them through Celery's own
``send_task`` (routing, headers, serialization) and kombu's own Redis channel (encoding,
priority lists, delivery tags) keeps them byte-for-byte what a direct publish would send.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kombu import Producer

from platform_tasks.errors import ConfigurationError

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery


@dataclass(frozen=True)
class WireMessage:
    """A message ready for the broker: the Redis list it goes to and its encoded body."""

    list_key: str
    wire: str
    delivery_tag: str


class _CapturedCommands:
    """Stands in for kombu's publish batch: records the Redis commands of one publish."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, tuple[Any, ...]]] = []

    def add(self, name: str, *args: Any) -> None:
        self.commands.append((name, args))


class _CapturingProducer(Producer):
    """A kombu producer whose final step records the message instead of sending it."""

    captured: list[tuple[str, tuple[Any, ...]]]

    def _publish(
        self,
        body: Any,
        priority: Any,
        content_type: Any,
        content_encoding: Any,
        headers: Any,
        properties: Any,
        routing_key: Any,
        mandatory: Any,
        immediate: Any,
        exchange: Any,
        declare: Any,
        timeout: Any = None,
        confirm_timeout: Any = None,
        retry: Any = False,
        retry_policy: Any = None,
    ) -> None:
        channel = self.channel
        message = channel.prepare_message(
            body, priority, content_type, content_encoding, headers, properties
        )
        capture = _CapturedCommands()
        channel.basic_publish(
            message, exchange=exchange, routing_key=routing_key, _publish_batch=capture
        )
        self.captured.extend(capture.commands)


class WireBuilder:
    """Turns ``send_task`` arguments into :class:`WireMessage` using a real kombu channel."""

    def __init__(self, app: PlatformCelery) -> None:
        self.app = app
        self._local = threading.local()

    def _producer(self) -> _CapturingProducer:
        producer = getattr(self._local, "producer", None)
        if producer is None:
            connection = self.app.connection_for_write()
            channel = connection.default_channel
            if not hasattr(channel, "_q_for_pri"):
                raise ConfigurationError(
                    "schedule() needs a Redis broker (PLATFORM_BROKER_URL): durable delays "
                    f"are stored on the broker's Redis, got transport {connection.transport_cls!r}"
                )
            producer = _CapturingProducer(channel, auto_declare=False)
            self._local.connection = connection
            self._local.producer = producer
        return producer

    @property
    def key_prefix(self) -> str:
        channel = self._producer().channel
        return str(getattr(channel, "global_keyprefix", "") or "")

    def build(self, task_name: str, **send_task_options: Any) -> WireMessage:
        producer = self._producer()
        producer.captured = []
        self.app.send_task(task_name, producer=producer, retry=False, **send_task_options)
        pushes = [args for name, args in producer.captured if name == "lpush"]
        if len(pushes) != 1:
            raise ConfigurationError(
                f"cannot delay task {task_name!r}: its route does not resolve to exactly one "
                f"Redis list (got {len(pushes)}); delays support direct queues only"
            )
        key, wire = pushes[0]
        text = wire.decode() if isinstance(wire, bytes) else str(wire)
        tag = json.loads(text)["properties"]["delivery_tag"]
        return WireMessage(list_key=self.key_prefix + str(key), wire=text, delivery_tag=tag)

    def close(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.release()
            self._local.connection = None
            self._local.producer = None
