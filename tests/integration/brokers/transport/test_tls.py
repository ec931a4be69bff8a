"""``rediss://`` brokers: the platform transport over a real TLS hop.

The test Redis speaks plain TCP, so a TLS-terminating proxy (``tls_proxy.py``) with a
certificate made at test time sits in front of it. Clients verify the certificate
(``ssl_cert_reqs=required`` with the cert as CA); the proxy counts completed handshakes,
so the assertions show the messages really crossed TLS.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlparse

import pytest
import redis
from kombu import Consumer, Exchange, Producer, Queue

from platform_tasks import create_app
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.integration.brokers.transport.conftest import ConnectionFactory
from tests.integration.brokers.transport.helpers import collector, drain_until
from tests.integration.brokers.transport.tls_proxy import SelfSigned, TlsProxy, self_signed_cert
from tests.support.processes import CeleryProcess, platform_env, worker_argv

REPO_ROOT = Path(__file__).resolve().parents[4]
SEEN_KEY = "test:transport:seen"  # written by tests/apps/transport_app.py


@pytest.fixture
def certificate(tmp_path: Path) -> SelfSigned:
    cert = self_signed_cert(tmp_path)
    if cert is None:
        # A missing tool must not turn the TLS check into a silent pass.
        pytest.fail("openssl is not on PATH: cannot make a test certificate")
    return cert


@pytest.fixture
def proxy(redis_url: str, certificate: SelfSigned) -> Iterator[TlsProxy]:
    target = urlparse(redis_url)
    assert target.hostname and target.port
    proxy = TlsProxy(certificate, (target.hostname, target.port)).start()
    yield proxy
    proxy.stop()


@pytest.fixture
def rediss_url(proxy: TlsProxy, certificate: SelfSigned) -> str:
    ca = quote(str(certificate.cert), safe="/")
    return f"rediss://127.0.0.1:{proxy.port}/0?ssl_cert_reqs=required&ssl_ca_certs={ca}"


def test_messages_round_trip_over_tls(
    connect: ConnectionFactory, rediss_url: str, proxy: TlsProxy, redis_client: redis.Redis
) -> None:
    queue = Queue("secure", Exchange("secure"), "secure")
    conn = connect(url=rediss_url)
    assert conn.ssl, "kombu did not take the ssl_* options from the rediss:// URL"
    producer = Producer(connect(url=rediss_url).channel())
    for n in range(20):
        producer.publish({"n": n}, exchange=queue.exchange, routing_key="secure", declare=[queue])
    received, on_message = collector()
    with Consumer(conn, [queue], callbacks=[on_message]):
        drain_until(conn, lambda: len(received) == 20)
        received[0].reject(requeue=True)
        drain_until(conn, lambda: len(received) == 21)
        for message in received[1:]:
            message.ack()
    assert sorted(m.payload["n"] for m in received[1:]) == list(range(20))
    assert received[-1].delivery_info["redelivered"] is True
    # The broker state went through the proxy into the plain Redis behind it.
    assert redis_client.llen("secure") == 0
    assert redis_client.hlen("unacked") == 0
    # Publisher, consumer and the consumer's polling connection all crossed TLS.
    assert proxy.handshakes >= 3
    assert proxy.protocols <= {"TLSv1.2", "TLSv1.3"}


def test_unverified_server_certificate_is_refused(
    connect: ConnectionFactory, proxy: TlsProxy, tmp_path: Path
) -> None:
    (tmp_path / "other").mkdir()
    other = self_signed_cert(tmp_path / "other")  # a CA that did not sign the proxy's cert
    assert other is not None
    url = (
        f"rediss://127.0.0.1:{proxy.port}/0?ssl_cert_reqs=required"
        f"&ssl_ca_certs={quote(str(other.cert), safe='/')}"
    )
    with pytest.raises(Exception, match="certificate verify failed"):
        connect(url=url).channel()


@pytest.mark.slow
def test_worker_consumes_over_tls(
    rediss_url: str, proxy: TlsProxy, redis_client: redis.Redis, tmp_path: Path
) -> None:
    settings = PlatformSettings.build(redis_url=rediss_url, profile="test")
    app = create_app("tls-publisher", settings=settings, task_send_sent_event=False)
    with app.connection_for_write() as conn:
        assert conn.transport.__module__.startswith("platform_tasks.brokers.transport")
        assert conn.ssl, "Celery did not take the ssl_* options from the rediss:// URL"
    with app.producer_or_acquire() as producer:
        for n in range(30):
            app.send_task("transport.count", args=[n], producer=producer)
    app.close()
    env = platform_env(redis_url=rediss_url, database_url=None)
    argv = worker_argv("tests.apps.transport_app", concurrency=2, extra=["--without-heartbeat"])
    worker = CeleryProcess(argv, env=env, cwd=REPO_ROOT, log_path=tmp_path / "worker.log")
    worker.start()
    try:
        wait_until(
            lambda: redis_client.hlen(SEEN_KEY) == 30,
            timeout=60,
            interval=0.05,
            message="worker to run every task over TLS",
        )
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{worker.log()[-4000:]}") from exc
    finally:
        worker.stop(timeout=15)
    assert sorted(int(k) for k in redis_client.hkeys(SEEN_KEY)) == list(range(30))
    assert redis_client.llen("default") == 0
    assert redis_client.hlen("unacked") == 0
    assert proxy.handshakes >= 3
