"""The console's login throttle: failed logins lock a client address, and an address and
user name together, out for a bounded time.

Two counts per failed login, each over a window of ``lockout`` seconds (default 900):

* the address and the user name typed: ``failures`` (default 5) lock that pair — the
  right password from that address is refused too, but the same user from elsewhere is
  not (a user cannot be locked out of the console by someone else's guesses);
* the address alone: ``failures_per_address`` (default 20) lock the address for every
  user (guessing across many user names).

A locked login gets ``429 Too Many Requests`` with ``Retry-After``, before Django checks
the password, and is not counted (the lock ends ``lockout`` seconds after the failure
that set it, never later). A successful login clears its pair's count.

The counts are rows of :class:`~platform_tasks.contrib.django.models.LoginFailures`, with
the console's own tables in PostgreSQL, not in process memory: several console processes
behind one proxy share them. Rows whose window has passed are deleted as new failures
arrive, a batch at a time, so the table holds about the keys of one window. Keys are
SHA-256 hashes: a password typed into the user name field is never stored or logged.

The client address is ``REMOTE_ADDR``. Behind a TLS proxy the standalone console's
server sets it from the last ``X-Forwarded-For`` entry, the one the proxy appended
(earlier entries are the client's to write; see :func:`platform_tasks.contrib.django.
server.serve`); a mounted console gets what the project's server sets.

Installed as the middleware :class:`LoginThrottleMiddleware` (the standalone settings
list it; a mounted console's project adds it to ``MIDDLEWARE``), configured by the
Django settings ``PLATFORM_CONSOLE_LOGIN_FAILURES``,
``PLATFORM_CONSOLE_LOGIN_FAILURES_PER_ADDRESS`` and ``PLATFORM_CONSOLE_LOGIN_LOCKOUT_SECONDS``.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.signals import (
    user_logged_in,
    user_login_failed,
)
from django.db import IntegrityError, router, transaction
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html

__all__ = [
    "Count",
    "LoginThrottleMiddleware",
    "Policy",
    "after_failure",
    "client_address",
    "policy_from_settings",
]

logger = logging.getLogger("platform_tasks.contrib.django.login_throttle")

PURGE_BATCH = 200
"""Expired rows deleted per recorded failure: bounded work per request, and the table
still shrinks faster than one failure a request can grow it."""
USERNAME_LENGTH = 150


@dataclass(frozen=True)
class Policy:
    """How many failures lock what, for how long."""

    failures: int = 5
    failures_per_address: int = 20
    lockout: timedelta = timedelta(minutes=15)

    def __post_init__(self) -> None:
        if self.failures < 1 or self.failures_per_address < 1:
            raise ValueError("the login failure limits must be at least 1")
        if self.lockout <= timedelta(0):
            raise ValueError("the login lockout must be positive")


@dataclass(frozen=True)
class Count:
    """One key's failures in its current window, and its lock."""

    failures: int
    window_started: datetime
    locked_until: datetime | None


def after_failure(count: Count | None, now: datetime, limit: int, policy: Policy) -> Count:
    """The count after one more failure at ``now``: a new window once the old one has
    passed; the lock set (``lockout`` from now) when the failures reach ``limit``."""
    if count is None or now - count.window_started >= policy.lockout:
        count = Count(0, now, None)
    failures = count.failures + 1
    locked = now + policy.lockout if failures >= limit else count.locked_until
    return Count(failures, count.window_started, locked)


def client_address(request: HttpRequest) -> str:
    """The address the server says the request came from."""
    return str(request.META.get("REMOTE_ADDR") or "unknown")


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


def policy_from_settings() -> Policy:
    return Policy(
        failures=int(getattr(settings, "PLATFORM_CONSOLE_LOGIN_FAILURES", 5)),
        failures_per_address=int(
            getattr(settings, "PLATFORM_CONSOLE_LOGIN_FAILURES_PER_ADDRESS", 20)
        ),
        lockout=timedelta(
            seconds=int(getattr(settings, "PLATFORM_CONSOLE_LOGIN_LOCKOUT_SECONDS", 900))
        ),
    )


class _Store:
    """The counts in :class:`LoginFailures` rows (the database Django's router picks)."""

    def __init__(self) -> None:
        from platform_tasks.contrib.django.models import LoginFailures

        self.model: Any = LoginFailures
        self.db = router.db_for_write(LoginFailures)

    def locked_until(self, keys: list[str], now: datetime) -> datetime | None:
        rows = self.model.objects.using(self.db).filter(key__in=keys, locked_until__gt=now)
        return max(rows.values_list("locked_until", flat=True), default=None)

    def record_failure(
        self, limits: list[tuple[str, int]], now: datetime, policy: Policy
    ) -> datetime | None:
        """Count one failure on each key; the lock it set, if any."""
        objects = self.model.objects.using(self.db)
        locked: datetime | None = None
        with transaction.atomic(using=self.db):
            for key, limit in sorted(limits):  # one lock order: no deadlock between two
                after = after_failure(self._locked_count(key, now), now, limit, policy)
                objects.filter(key=key).update(
                    failures=after.failures,
                    window_started=after.window_started,
                    locked_until=after.locked_until,
                )
                if after.locked_until is not None and after.locked_until > now:
                    locked = max(locked or after.locked_until, after.locked_until)
            expired = objects.filter(window_started__lt=now - policy.lockout).exclude(
                locked_until__gt=now
            )
            stale = list(expired.values_list("key", flat=True)[:PURGE_BATCH])
            if stale:
                objects.filter(key__in=stale, window_started__lt=now - policy.lockout).delete()
        return locked

    def _locked_count(self, key: str, now: datetime) -> Count | None:
        """The key's count, its row locked until the transaction ends (made empty first
        when missing, so that two processes counting the same key take turns)."""
        objects = self.model.objects.using(self.db)
        row = objects.select_for_update().filter(key=key).first()
        if row is None:
            try:
                with transaction.atomic(using=self.db):
                    objects.create(key=key, failures=0, window_started=now)
            except IntegrityError:
                pass  # another process made it first
            row = objects.select_for_update().get(key=key)
        if row.failures == 0:
            return None
        return Count(row.failures, row.window_started, row.locked_until)

    def clear(self, key: str) -> None:
        self.model.objects.using(self.db).filter(key=key).delete()


_OUTCOME = "_platform_console_login_outcome"
_FAILED = "failed"
_SUCCEEDED = "succeeded"


def _note_failure(sender: Any, request: HttpRequest | None = None, **kwargs: Any) -> None:
    """``authenticate`` refused the credentials of a login this middleware watches (the
    signals, not the response, tell: a user already logged in who posts a wrong password
    for another name gets the form back like anyone, and is counted like anyone)."""
    if request is not None and hasattr(request, _OUTCOME):
        setattr(request, _OUTCOME, _FAILED)


def _note_success(sender: Any, request: HttpRequest | None = None, **kwargs: Any) -> None:
    if request is not None and hasattr(request, _OUTCOME):
        setattr(request, _OUTCOME, _SUCCEEDED)


def _known_user(name: str) -> bool:
    model: Any = get_user_model()
    return bool(model._default_manager.filter(**{model.USERNAME_FIELD: name}).exists())


class LoginThrottleMiddleware:
    """Refuses a locked login with 429 before the login view runs; counts the failures
    and clears a pair's count on success (see the module's docstring)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        user_login_failed.connect(_note_failure, dispatch_uid=f"{__name__}.failed")
        user_logged_in.connect(_note_success, dispatch_uid=f"{__name__}.succeeded")
        self.policy = policy_from_settings()
        self._store: _Store | None = None

    @property
    def store(self) -> _Store:
        if self._store is None:
            self._store = _Store()
        return self._store

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method != "POST" or not self._is_login(request.path):
            return self.get_response(request)
        address = client_address(request)
        typed = str(request.POST.get("username") or "").strip()[:USERNAME_LENGTH]
        pair = _key("user", address, typed.casefold())
        everyone = _key("address", address)
        now = timezone.now()
        until = self.store.locked_until([pair, everyone], now)
        if until is not None:
            return self._refused(address, until, now)
        setattr(request, _OUTCOME, None)
        response = self.get_response(request)
        outcome = getattr(request, _OUTCOME, None)
        if outcome == _SUCCEEDED:
            self.store.clear(pair)
        elif outcome == _FAILED:
            limits = [(pair, self.policy.failures), (everyone, self.policy.failures_per_address)]
            locked = self.store.record_failure(limits, now, self.policy)
            if locked is not None:
                self._log_lock(address, typed, locked)
        return response

    def _is_login(self, path: str) -> bool:
        try:
            return bool(path == reverse("admin:login"))
        except NoReverseMatch:
            return False

    def _refused(self, address: str, until: datetime, now: datetime) -> HttpResponse:
        seconds = max(1, math.ceil((until - now).total_seconds()))
        logger.warning(
            "login from %s refused: locked until %s after repeated failures",
            address,
            until.isoformat(timespec="seconds"),
            extra={"event": "console.login_refused", "address": address},
        )
        body = format_html(
            "<!DOCTYPE html><title>Too many failed logins</title>"
            "<h1>Too many failed logins</h1><p>Too many failed logins from this address; "
            "try again after {} UTC (in {} seconds).</p>",
            until.astimezone(UTC).strftime("%H:%M:%S"),
            seconds,
        )
        response = HttpResponse(body, status=429, content_type="text/html; charset=utf-8")
        response["Retry-After"] = str(seconds)
        return response

    def _log_lock(self, address: str, typed: str, until: datetime) -> None:
        # the name typed may be a password typed into the wrong field: logged only when
        # it names a user
        shown = typed if typed and _known_user(typed) else "(not a user)"
        logger.warning(
            "logins from %s locked until %s after repeated failures (last user name: %s)",
            address,
            until.isoformat(timespec="seconds"),
            shown,
            extra={"event": "console.login_locked", "address": address},
        )
