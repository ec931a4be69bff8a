"""An outbox row of a RabbitMQ deployment (an encoded AMQP message) belongs to the
correlation id its argsrepr header ends with, whole; an unreadable row to none."""

from __future__ import annotations

from platform_tasks.jobs_status.outbox_rows import belongs
from platform_tasks.publishing.amqp_wire import AmqpMessage


def _amqp(correlation_id: str) -> str:
    argsrepr = f"(job_id=j tenant=acme kind=reports.build correlation_id={correlation_id})"
    headers = {"id": "j", "argsrepr": argsrepr}
    return AmqpMessage("reports", "", "reports", "e30=", {"application_headers": headers}).encode()


def test_an_amqp_row_belongs_to_its_whole_correlation_id() -> None:
    assert belongs("amqp", _amqp("order-5"), "order-5")
    assert not belongs("amqp", _amqp("order-50"), "order-5")
    assert belongs("amqp", _amqp('café "5"'), 'café "5"')
    assert not belongs("amqp", "not json", "order-5")
    assert not belongs("redis", '{"q": "reports"}', "order-5")
