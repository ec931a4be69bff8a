"""The Resend-like test server counts requests by when they reached this machine.

A provider on another machine counts what its network received. This server shares the
machine's two cores with the workers it serves, so a thread of it may read a request
tens of milliseconds after it arrived (measured up to 51 ms in the throughput benchmark);
its rate limit must count the arrival, whatever order its threads handle requests in.
"""

from __future__ import annotations

import json
import socket
import time

from platform_tasks.testing.servers import wait_until
from tests.support.resend_server import (
    API_KEY,
    ResendLikeServer,
    received_at,
    stamp_arrivals,
)

BODY = json.dumps(
    {"from": "a@example.com", "to": "b@example.org", "subject": "s", "text": "t"}
).encode()
HEADERS = {"authorization": f"Bearer {API_KEY}", "content-type": "application/json"}


def test_a_request_read_late_is_stamped_when_its_bytes_arrived() -> None:
    """The read comes 50 ms after the send, as a busy thread's would: the stamp is the send."""
    listener = socket.create_server(("127.0.0.1", 0))
    with listener, socket.create_connection(listener.getsockname()) as client:
        conn, _ = listener.accept()
        with conn:
            stamp_arrivals(conn)
            before = time.monotonic()
            client.sendall(b"POST /emails HTTP/1.1\r\n")
            sent = time.monotonic()
            wait_until(lambda: time.monotonic() >= sent + 0.05, timeout=5, interval=0.005)
            stamp = received_at(conn)
            read = time.monotonic()
            assert stamp is not None
            # the realtime-to-monotonic conversion is good to well under a millisecond
            assert before - 0.002 <= stamp <= sent + 0.002, (before, stamp, sent)
            assert read - stamp >= 0.05
            assert conn.recv(100) == b"POST /emails HTTP/1.1\r\n"  # the peek left it there
        client.close()
        assert received_at(conn) is None  # closed: nothing to stamp


def test_the_rate_limit_counts_arrivals_whatever_order_they_are_handled_in() -> None:
    """Three a second; requests handed over out of arrival order, as threads do."""
    server = ResendLikeServer(rate_limit=3)

    def status(arrived: float) -> int:
        return server.handle("POST", "/emails", HEADERS, BODY, arrived)[0]

    assert [status(t) for t in (10.0, 10.5, 10.9)] == [200, 200, 200]
    # arrived before the three, handled after them: the second (9.9, 10.9] would hold four
    assert status(9.95) == 429
    # arrived long before: no second that holds it holds another request
    assert status(8.5) == 200
    # arrived after the three: (10.05, 11.05] holds 10.5 and 10.9, so it still fits
    assert status(11.05) == 200
    # but now (10.1, 11.1] holds 10.5, 10.9 and 11.05: full
    assert status(11.1) == 429
    limited = [r for r in server.snapshot()[0] if r.status == 429]
    assert [r.at for r in limited] == [9.95, 11.1]
