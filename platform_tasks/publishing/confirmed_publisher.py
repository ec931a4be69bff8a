"""Publish a batch of AMQP messages and learn which ones RabbitMQ confirmed.

A promoter may remove a delay-store entry only once RabbitMQ has taken responsibility for
its message, which is what a publisher confirm says (a quorum queue confirms after a
quorum of its members wrote the message). Waiting for each confirm before the next publish
costs one round trip (and one log sync) per message; here a batch is published on a
channel in confirm mode and the confirms are collected afterwards, RabbitMQ acknowledging
many messages with one ``basic.ack`` (``multiple``). Messages are published ``mandatory``:
one no queue would take is returned, and counts as not confirmed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import amqp
from kombu.exceptions import KombuError

from platform_tasks.errors import BrokerPublishError
from platform_tasks.publishing.amqp_wire import AmqpMessage

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

logger = logging.getLogger(__name__)


class ConfirmedPublisher:
    """One connection and one confirm-mode channel, reopened after any failure."""

    def __init__(self, app: PlatformCelery, *, confirm_timeout: float = 30.0) -> None:
        self.app = app
        self.confirm_timeout = confirm_timeout
        self._connection: Any = None
        self._channel: Any = None
        self._declared: set[str] = set()
        self._seq = 0
        self._pending: dict[int, int] = {}  # delivery tag -> index in the batch
        self._results: list[bool | None] = []
        self._returned: set[int] = set()
        self.returned: set[int] = set()
        """Indices of the last batch's messages RabbitMQ returned as unroutable."""
        self._by_correlation: dict[str, int] = {}

    # -- connection ----------------------------------------------------------------

    def _open(self) -> Any:
        if self._channel is not None:
            return self._channel
        # confirm_publish off on this connection: with it, py-amqp waits for every
        # publish's confirm in turn; this channel collects them per batch instead.
        connection = self.app.connection_for_write(transport_options={"confirm_publish": False})
        try:
            connection.ensure_connection(max_retries=1)
            channel = connection.channel()
            channel.confirm_select()
        except BaseException:
            connection.release()
            raise
        channel.events["basic_ack"].add(self._on_ack)
        channel.events["basic_nack"].add(self._on_nack)
        channel.events["basic_return"].add(self._on_return)
        self._connection = connection
        self._channel = channel
        self._seq = 0
        self._declared = set()
        return channel

    def _errors(self) -> tuple[type[BaseException], ...]:
        connection = self._connection or self.app.connection_for_write()
        try:
            return (
                *connection.connection_errors,
                *connection.channel_errors,
                OSError,
                amqp.exceptions.AMQPError,
                KombuError,
            )
        finally:
            if self._connection is None:
                connection.release()

    def ensure_connected(self) -> None:
        """Open the connection now (before claiming entries), raising
        :class:`BrokerPublishError` when RabbitMQ cannot be reached."""
        try:
            self._open()
        except self._errors() as exc:
            self.close()
            raise BrokerPublishError(f"cannot reach RabbitMQ: {type(exc).__name__}") from exc

    def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            try:
                connection.release()
            except Exception:  # closing a broken connection may fail again
                logger.debug(
                    "closing a failed RabbitMQ connection raised",
                    extra={"event": "delay.publisher_close_failed"},
                )

    # -- confirms ------------------------------------------------------------------

    def _settle(self, tag: int, multiple: bool, confirmed: bool) -> None:
        tags = [t for t in self._pending if t <= tag] if multiple else [tag]
        for t in tags:
            index = self._pending.pop(t, None)
            if index is not None:
                self._results[index] = confirmed and index not in self._returned

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        self._settle(delivery_tag, multiple, True)

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        self._settle(delivery_tag, multiple, False)

    def _on_return(self, exc: Any, exchange: str, routing_key: str, message: Any) -> None:
        correlation = getattr(message, "properties", {}).get("correlation_id")
        index = self._by_correlation.get(str(correlation))
        if index is not None:
            self._returned.add(index)
        logger.warning(
            "RabbitMQ returned a delayed job no queue would take (exchange %s, routing key %s)",
            exchange,
            routing_key,
            extra={"event": "delay.publish_returned"},
        )

    # -- publishing ----------------------------------------------------------------

    def _declare(self, queue_name: str) -> None:
        if not queue_name or queue_name in self._declared:
            return
        queue = self.app.amqp.queues[queue_name]  # created like a direct publish creates it
        queue.bind(self._channel).declare()
        self._declared.add(queue_name)

    def queue_depth(self, queue_name: str) -> int:
        """Messages ready on ``queue_name`` now (the queue is declared first, as a publish
        to it would declare it); a connection failure raises :class:`BrokerPublishError`."""
        try:
            channel = self._open()
            self._declare(queue_name)
            _name, ready, _consumers = channel.queue_declare(queue=queue_name, passive=True)
        except self._errors() as exc:
            self.close()
            raise BrokerPublishError(
                f"reading the depth of queue {queue_name!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
        return int(ready)

    def publish(
        self, messages: list[AmqpMessage], *, renew: Callable[[], bool] | None = None
    ) -> list[bool]:
        """Publish ``messages``; ``True`` for each one RabbitMQ confirmed.

        A nack, a return or no confirm within ``confirm_timeout`` gives ``False``; a
        connection failure raises :class:`BrokerPublishError` (the results so far are lost
        to the caller, who must treat every message as unconfirmed).

        ``renew`` is called each time ``confirm_timeout`` passes without all confirms; while
        it returns ``True`` the wait goes on for another ``confirm_timeout`` (a promoter
        renews its claim's lease there, so a slow confirm is awaited, not published again).
        """
        self._results = [None] * len(messages)
        self._pending = {}
        self._returned = set()
        self.returned = set()
        self._by_correlation = {}
        try:
            channel = self._open()
            for index, message in enumerate(messages):
                self._declare(message.queue)
                correlation = message.properties.get("correlation_id")
                if correlation is not None:
                    self._by_correlation[str(correlation)] = index
                self._seq += 1
                self._pending[self._seq] = index
                channel.basic_publish(
                    amqp.Message(message.body.encode(), **message.properties),
                    exchange=message.exchange,
                    routing_key=message.routing_key,
                    mandatory=True,
                )
            deadline = time.monotonic() + self.confirm_timeout
            while self._pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0 and renew is not None and renew():
                    deadline = time.monotonic() + self.confirm_timeout
                    continue
                if remaining <= 0:
                    self.close()  # late confirms would land on the next batch's tags
                    break
                try:
                    self._connection.drain_events(timeout=min(remaining, 1.0))
                except TimeoutError:
                    continue
        except self._errors() as exc:
            self.close()
            raise BrokerPublishError(
                f"publishing to RabbitMQ failed: {type(exc).__name__}: {exc}"
            ) from exc
        self.returned = set(self._returned)
        return [bool(result) for result in self._results]
