"""Marketing yields to transactional on RabbitMQ: depth read from the broker's quorum queue.

The same set-up as ``tests/e2e/notifications/test_notifications_yield.py`` with
``PLATFORM_BROKER_URL`` a fresh RabbitMQ virtual host: a real worker consuming both rails
(no ``-Q``), a Resend-like server on loopback that holds its answers (gate closed) while
the transactional quorum queue fills, so the depth the worker reads through a passive
``queue.declare`` is known. Then the server answers again and the test watches which rail
drains first.
"""

from __future__ import annotations

from pathlib import Path

from platform_tasks.notifications import publish_blast
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.e2e.brokers.rabbitmq.conftest import queue_types
from tests.e2e.notifications.support import key_of, rig
from tests.support.servers import RabbitMQServer

TRANSACTIONAL = "notif.email.transactional"
MARKETING = "notif.email.marketing"


def test_marketing_pauses_while_the_transactional_quorum_queue_is_deep_and_resumes_after(
    broker_settings: PlatformSettings, rabbitmq_server: RabbitMQServer, tmp_path: Path
) -> None:
    env = {
        "PLATFORM_PROVIDER_RATE_LIMITS": "resend=1000/s",
        "PLATFORM_MARKETING_PAUSE_DEPTH": "20",
        "PLATFORM_MARKETING_RESUME_DEPTH": "5",
    }
    with rig(
        broker_settings.redis_url,
        str(broker_settings.database_url),
        tmp_path,
        env=env,
        broker_url=str(broker_settings.broker_url),
    ) as r:
        worker = r.workers[0]
        r.server.gate.clear()
        marketing = publish_blast(
            r.port,
            kind="notify.newsletter",
            tenant_id="acme",
            campaign_id="spring",
            recipients=(f"m{n}@example.org" for n in range(50)),
            chunk_size=1,
        )
        transactional = [r.receipt("acme", n) for n in range(100)]
        worker.wait_for_log("marketing paused on email", timeout=60)
        paused_line = next(
            line for line in worker.log().splitlines() if "marketing paused on email" in line
        )
        r.server.gate.set()
        transactional_keys = {key_of(job) for job in transactional}
        marketing_keys = {key_of(job) for job in marketing}

        def transactional_done() -> bool:
            return transactional_keys <= {k for k, _ in r.delivered()}

        wait_until(transactional_done, timeout=120, message="every transactional email")
        marketing_sent = {k for k, _ in r.delivered()} & marketing_keys
        # taken before the pause (at most 2 processes x 1 prefetched + 2 running) or after
        # the resume near the end; without the yield about half would be out by now
        assert len(marketing_sent) <= 15, f"{len(marketing_sent)} marketing emails went first"
        wait_until(
            lambda: marketing_keys <= {k for k, _ in r.delivered()},
            timeout=120,
            message="every marketing email after the resume",
        )
        worker.wait_for_log("marketing resumed on email", timeout=30)
        assert "notifications.depth_unreadable" not in worker.log()
        assert "transactional depth unreadable" not in worker.log()
        assert r.dead_letters() == 0
        r.assert_exactly_once(150)
    # the depth that paused marketing was RabbitMQ's count of the transactional quorum queue
    depth = int(paused_line.split("transactional depth ")[1].split()[0])
    assert depth > 20, paused_line
    types = queue_types(rabbitmq_server, broker_settings)
    assert (types[TRANSACTIONAL], types[MARKETING]) == ("quorum", "quorum")
