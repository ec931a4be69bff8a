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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["AppState"]

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
