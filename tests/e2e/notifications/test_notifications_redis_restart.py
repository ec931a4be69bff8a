"""Redis (broker, delays and rate limits) restarted while a worker sends notifications.

Needs a private Redis (``server_factory``) so the restart does not disturb other tests;
the worker itself is started as users start it (no ``-Q``). The visibility timeout is
shortened to 10 s: a message whose ack (or restore) could not reach the stopped Redis stays
unacked and comes back by the visibility sweep, as documented, and with the default 300 s
that alone would outlast the test's wait.
"""

from __future__ import annotations

from pathlib import Path

from platform_tasks.notifications import publish_blast
from platform_tasks.testing.servers import wait_until
from tests.conftest import ServerFactory
from tests.e2e.notifications.support import key_of, rig


def test_redis_restart_mid_run_drops_nothing_and_sends_nothing_twice(
    server_factory: ServerFactory, database_url: str, tmp_path: Path
) -> None:
    broker = server_factory.redis(appendfsync="always")
    env = {
        "PLATFORM_PROVIDER_RATE_LIMITS": "resend=10/s",
        "PLATFORM_VISIBILITY_TIMEOUT_SECONDS": "10",
    }
    with rig(broker.url, database_url, tmp_path, env=env) as r:
        worker = r.workers[0]
        receipts = [r.receipt("acme", n) for n in range(40)]
        blasts = publish_blast(
            r.port,
            kind="notify.newsletter",
            tenant_id="acme",
            campaign_id="restart",
            recipients=(f"b{n}@example.org" for n in range(150)),
        )
        wait_until(lambda: len(r.delivered()) >= 8, timeout=60, message="first emails")
        offset = len(worker.log())
        broker.stop()  # SIGTERM: Redis writes its append-only file and exits
        worker.wait_for_log("Connection to broker lost", timeout=60, after=offset)
        sent_while_down = len(r.delivered())
        broker.start()  # same port, same data directory
        expected = {key_of(job) for job in receipts + blasts}
        wait_until(
            lambda: expected <= {k for k, _ in r.delivered()},
            timeout=180,
            message="every email after the restart",
        )
        assert sent_while_down < 190, "the restart must catch the run midway"
        assert r.dead_letters() == 0
        r.assert_exactly_once(190)
