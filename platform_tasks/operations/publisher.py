"""The publisher of a replay, opened from the application or from the settings alone.

Replay by id, by filter, ``--all`` and the console all publish through one
:class:`ReplayPublisher`: with the application when one is given (or named, ``--app``:
its routing, exchanges and transport options), else with a port built from the
platform settings alone (:func:`~platform_tasks.app.platform_queue_port`), so a replay
runs from an ops box without the application's code. It opens at the first row to
publish, so a replay that matches nothing imports no application and opens no broker
connection, and it closes what it opened.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from platform_tasks.dead_letters.batch import Publish
from platform_tasks.settings import PlatformSettings

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery
    from platform_tasks.publishing.queue_port import QueuePort

__all__ = ["ReplayPublisher"]


class ReplayPublisher:
    """Opens ``QueuePort(app).publish`` (``app``, or what ``load_app`` returns) or a port of
    ``settings`` alone, once, on the first :meth:`open`; :meth:`close` closes it."""

    def __init__(
        self,
        settings: PlatformSettings,
        *,
        app: PlatformCelery | None = None,
        load_app: Callable[[], PlatformCelery] | None = None,
    ) -> None:
        self.settings = settings
        self.app = app
        self.load_app = load_app
        self._port: QueuePort | None = None

    def open(self) -> Publish:
        """The port's publish, opened now if not yet; loading the app raises unchanged."""
        if self._port is None:
            from platform_tasks.app import platform_queue_port
            from platform_tasks.publishing.queue_port import QueuePort

            app = self.app if self.app is not None else self.load_app and self.load_app()
            self._port = QueuePort(app) if app is not None else platform_queue_port(self.settings)
        publish: Publish = self._port.publish
        return publish

    def close(self) -> None:
        if self._port is not None:
            port, self._port = self._port, None
            port.close()

    def __enter__(self) -> ReplayPublisher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
