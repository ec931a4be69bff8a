"""Fixtures of the PostgreSQL integration tests: the housekeeping tests insert dead letters
and idempotency rows with the same connection and row factory as the dead-letter tests."""

from __future__ import annotations

from tests.integration.dead_letters.conftest import add_row, conn

__all__ = ["add_row", "conn"]
