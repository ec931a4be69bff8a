from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.resend_server import ResendLikeServer


@pytest.fixture
def resend() -> Iterator[ResendLikeServer]:
    """A Resend-like server on loopback (no rate limit unless a test sets one)."""
    with ResendLikeServer() as server:
        yield server
