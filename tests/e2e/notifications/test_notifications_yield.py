"""Marketing yields to transactional, in a real worker that consumes both rails (no ``-Q``).

The provider holds its answers (its gate closed) while the transactional queue fills, so
the depth the worker reads from the broker is known; then it answers again and the test
watches which rail drains first.
"""

from __future__ import annotations

from pathlib import Path

from platform_tasks.notifications import publish_blast
from platform_tasks.testing.servers import wait_until
from tests.e2e.notifications.support import key_of, rig


def test_marketing_pauses_while_transactional_is_deep_and_resumes_after(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    env = {
        "PLATFORM_PROVIDER_RATE_LIMITS": "resend=1000/s",
        "PLATFORM_MARKETING_PAUSE_DEPTH": "20",
        "PLATFORM_MARKETING_RESUME_DEPTH": "5",
    }
    with rig(redis_url, database_url, tmp_path, env=env) as r:
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
        assert r.dead_letters() == 0
        r.assert_exactly_once(150)
