"""A consumer that dies by SIGKILL right after Redis handed it a message.

Run as ``python -m tests.integration.brokers.transport.kill_after_fetch URL TRANSPORT QUEUE``.
It sends the command the event loop sends to take a message (stock: BRPOP; platform:
the fetch script), waits until Redis has executed it (the queue is empty) and kills
itself before reading the reply: the exact window in which stock kombu loses a message.
"""

from __future__ import annotations

import os
import signal
import sys

import redis
from kombu import Connection, Exchange, Queue

from platform_tasks.testing.servers import wait_until


def main(url: str, transport: str, queue_name: str) -> None:
    conn = Connection(url, transport=None if transport == "stock" else transport)
    channel = conn.channel()
    queue = Queue(queue_name, Exchange(queue_name), queue_name)(channel)
    queue.declare()
    channel.basic_consume(queue_name, False, lambda message: None, "killed-consumer")
    conn.transport.cycle.on_poll_start()  # what the event loop does each tick
    client = redis.Redis.from_url(url)
    wait_until(lambda: client.llen(queue_name) == 0, timeout=10)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(*sys.argv[1:4])
