"""Typed state a concern keeps per Celery app, on the app object itself.

A concern that remembers something per app (its hooks, its queue port, its validated
jobs...) declares one :class:`AppState` for it, naming the value's type, and reads and
writes it only through that. The value is kept in the app's own ``__dict__``:

- one value per app object, plain ``Celery()`` apps included (some installers accept
  them), and none on an app the concern never touched;
- it lives exactly as long as the app: a module-level mapping keyed by the app would keep
  an app alive forever when its value refers back to it (a hook or a queue port holding
  the app), where here the two are garbage together;
- a prefork child reads what its parent set before the fork (the app is copied with it).

A concern that keeps connections per app *and per process* (the consumer's PostgreSQL
sessions, the email providers' HTTP connections, the limits' Redis client) declares one
:class:`ProcessState` instead: it makes the value on first use in each process, and
``app.close()`` closes it (each one registers itself when it is declared).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["AppState", "ProcessState", "close_process_state"]

T = TypeVar("T")


class AppState(Generic[T]):
    """One value of type ``T`` per Celery app, stored on the app as attribute ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def get(self, app: Celery) -> T | None:
        """The app's value, or ``None`` when none was set."""
        value: T | None = vars(app).get(self.name)
        return value

    def set(self, app: Celery, value: T) -> None:
        vars(app)[self.name] = value

    def get_or_set(self, app: Celery, make: Callable[[], T]) -> T:
        """The app's value, made by ``make`` and kept on first use (not kept if it raises)."""
        value = self.get(app)
        if value is None:
            value = make()
            self.set(app, value)
        return value


class ProcessState(Generic[T]):
    """One value of type ``T`` per Celery app and per process, closed with the app.

    ``get`` makes the value on first use in a process, and again in a forked child: a
    connection must not be shared across a fork. The parent's value stays referenced in the
    child and is never closed there (closing a copied socket would end the parent's
    session). ``app.close()`` closes this process's value; a later ``get`` makes a new one.
    The value is kept on the app (as :class:`AppState` does), so an app made after another
    was collected never finds the other's value.
    """

    def __init__(self, name: str, make: Callable[[Celery], T], close: Callable[[T], None]) -> None:
        self.name = name
        self._make = make
        self._close = close
        _DECLARED.append(self)

    def _values(self, app: Celery) -> dict[int, T]:
        values: dict[int, T] = vars(app).setdefault(self.name, {})
        return values

    def get(self, app: Celery) -> T:
        """This process's value for ``app``, made now if it has none."""
        values = self._values(app)
        pid = os.getpid()
        value = values.get(pid)
        if value is None:
            value = values[pid] = self._make(app)
        return value

    def set(self, app: Celery, value: T) -> None:
        """Use ``value`` as this process's value for ``app`` (a test's stand-in)."""
        self._values(app)[os.getpid()] = value

    def close(self, app: Celery) -> None:
        """Close and forget this process's value for ``app``, if it has one."""
        value = self._values(app).pop(os.getpid(), None)
        if value is not None:
            self._close(value)


_DECLARED: list[ProcessState[Any]] = []


def close_process_state(app: Celery) -> None:
    """Close every :class:`ProcessState` value this process holds for ``app``
    (``PlatformCelery.close``)."""
    for state in list(_DECLARED):
        state.close(app)
