"""The harness's RabbitMQ node: isolated ports and files, fresh virtual hosts per test."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import kombu
import pytest
from amqp.exceptions import NotFound  # type: ignore[import-untyped]

from tests.support.servers import RabbitMQServer, find_epmd


def test_the_node_keeps_to_its_own_ports_and_folder(
    rabbitmq_server: RabbitMQServer, rabbitmq_url: str
) -> None:
    assert rabbitmq_server.port != 5672 and rabbitmq_server.epmd_port != 4369
    names = subprocess.run(
        [str(find_epmd()), "-port", str(rabbitmq_server.epmd_port), "-names"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    short_name = rabbitmq_server.nodename.split("@")[0]
    assert f"name {short_name} at port {rabbitmq_server.dist_port}" in names
    environment = rabbitmq_server.ctl("environment")
    assert str(rabbitmq_server.data_dir / "mnesia") in environment
    assert "{consumer_timeout,1800000}" in environment


def test_each_test_gets_an_empty_virtual_host(
    rabbitmq_server: RabbitMQServer, rabbitmq_url: str
) -> None:
    with kombu.Connection(rabbitmq_url) as conn:
        queue = conn.SimpleQueue("leftover")
        queue.put({"n": 1})
        queue.close()
    again = rabbitmq_server.fresh_vhost("harness-next", drop=[rabbitmq_url.rsplit("/", 1)[1]])
    try:
        with kombu.Connection(again) as conn, pytest.raises(NotFound):
            conn.default_channel.queue_declare("leftover", passive=True)
    finally:
        rabbitmq_server.delete_vhost("harness-next")


def test_a_port_taken_before_the_node_binds_it_gets_a_fresh_one(tmp_path: Path) -> None:
    """``free_port`` only finds a port free at that moment; another process can bind it
    before the node does (seen on a busy machine: ``dist_port_already_used``). The node
    then starts on fresh ports instead of failing the session, and its crash dump stays
    in its own folder."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        server = RabbitMQServer(tmp_path / "rabbitmq")
        server.dist_port = taken
        try:
            server.start()
            assert server.running and server.dist_port != taken
            with kombu.Connection(server.url) as conn:
                conn.connect()
        finally:
            server.close()
    assert (tmp_path / "rabbitmq" / "erl_crash.dump").exists()
