"""Build the exact AMQP message Celery would publish to RabbitMQ, without publishing it.

With ``PLATFORM_RABBITMQ_DELAYS=delay_store`` a delayed job waits in the Redis delay store
as a finished AMQP message (exchange, routing key, body, properties), so the promoter that
publishes it when it is due needs nothing of the task: it sends the bytes a direct
``publish`` would have sent. The message is built by Celery's own ``send_task`` (routing,
headers, serialization) through a kombu producer whose last step records instead of
sending; no connection to RabbitMQ is opened for it.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from amqp import Message
from kombu import Producer

from platform_tasks.errors import ConfigurationError

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery


@dataclass(frozen=True)
class AmqpMessage:
    """One message for RabbitMQ: where it goes and what it is."""

    queue: str
    """The queue it is meant for (declared by the promoter before publishing)."""
    exchange: str
    routing_key: str
    body: str
    properties: dict[str, Any] = field(default_factory=dict)
    """AMQP basic properties; ``application_headers`` carries Celery's task headers."""

    def encode(self) -> str:
        """Compact JSON for the delay store's entry hash."""
        return json.dumps(
            {
                "q": self.queue,
                "e": self.exchange,
                "r": self.routing_key,
                "b": self.body,
                "p": self.properties,
            },
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, raw: str | bytes) -> AmqpMessage:
        data = json.loads(raw)
        return cls(
            queue=str(data["q"]),
            exchange=str(data["e"]),
            routing_key=str(data["r"]),
            body=str(data["b"]),
            properties=dict(data["p"]),
        )


_BASIC_PROPERTIES = frozenset(name for name, _ in Message.PROPERTIES)
"""What AMQP carries of a message's properties; Celery's extra keywords are not among them."""


class _RecordingProducer(Producer):
    """A kombu producer whose final step records the message instead of sending it."""

    recorded: list[AmqpMessage]
    queue_name: str = ""
    event_exchange: str = "celeryev"

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
        if exchange == self.event_exchange:
            return  # the task-sent event belongs to the scheduling, not to the job
        props = {k: v for k, v in (properties or {}).items() if k in _BASIC_PROPERTIES}
        if priority is not None:
            props["priority"] = priority
        props["content_type"] = content_type
        props["content_encoding"] = content_encoding
        props["application_headers"] = dict(headers or {})
        text = body.decode(content_encoding or "utf-8") if isinstance(body, bytes) else str(body)
        self.recorded.append(
            AmqpMessage(
                queue=self.queue_name,
                exchange=str(exchange or ""),
                routing_key=str(routing_key or ""),
                body=text,
                properties=props,
            )
        )


class AmqpMessageBuilder:
    """Turns ``send_task`` arguments into an :class:`AmqpMessage`."""

    def __init__(self, app: PlatformCelery) -> None:
        self.app = app
        self._local = threading.local()

    def _producer(self) -> _RecordingProducer:
        producer = getattr(self._local, "producer", None)
        if producer is None:
            # A connection object only: the producer's channel is a promise never kept,
            # because the recording step replaces the one that would use it.
            producer = _RecordingProducer(self.app.connection_for_write(), auto_declare=False)
            producer.event_exchange = str(self.app.conf.event_exchange or "celeryev")
            self._local.producer = producer
        return producer

    def build(self, task_name: str, **send_task_options: Any) -> AmqpMessage:
        """The message ``app.send_task(task_name, **send_task_options)`` would publish."""
        producer = self._producer()
        producer.recorded = []
        producer.queue_name = str(send_task_options.get("queue") or "")
        self.app.send_task(task_name, producer=producer, retry=False, **send_task_options)
        if len(producer.recorded) != 1:
            raise ConfigurationError(
                f"cannot delay task {task_name!r}: sending it produced "
                f"{len(producer.recorded)} messages, expected one"
            )
        return producer.recorded[0]

    def close(self) -> None:
        producer = getattr(self._local, "producer", None)
        if producer is not None:
            connection = producer.__connection__
            if connection is not None:
                connection.release()
            self._local.producer = None
