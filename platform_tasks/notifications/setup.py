"""Wiring notification rails into an app: queues, the marketing yield, providers.

``create_app`` calls :func:`install`; applications register their own providers (SMS,
push) with :func:`register_provider`, by the name their rate limit uses. Each worker
process builds its :class:`~platform_tasks.notifications.dispatch.Dispatcher` on first use
(again after a fork), with a Redis client of its own for the rate limits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from platform_tasks.app_state import AppState, ProcessState
from platform_tasks.brokers.redis_client import build_redis
from platform_tasks.brokers.worker_queues import add_queue_source
from platform_tasks.notifications.dispatch import Dispatcher
from platform_tasks.notifications.limiter import RateLimiter
from platform_tasks.notifications.marketing_yield import MarketingYield
from platform_tasks.notifications.provider import Provider
from platform_tasks.notifications.rails import queue_source
from platform_tasks.settings import PlatformSettings

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = ["ProviderFactory", "dispatcher_for", "install", "register_provider"]

ProviderFactory = Callable[[PlatformSettings], Provider]
"""Builds a provider adapter from settings, in the worker process that uses it."""

_PROVIDERS: AppState[dict[str, ProviderFactory]] = AppState("platform_notification_providers")


def _resend(settings: PlatformSettings) -> Provider:
    from platform_tasks.notifications.resend import ResendProvider

    return ResendProvider(settings.resend_api_key, settings.resend_base_url)


def providers_of(app: PlatformCelery) -> dict[str, ProviderFactory]:
    """``app``'s provider factories by name; Resend's is there from the start."""
    return _PROVIDERS.get_or_set(app, lambda: {"resend": _resend})


def register_provider(app: PlatformCelery, name: str, factory: ProviderFactory) -> None:
    """Send ``NotificationTask(provider=name)`` jobs through the adapter ``factory`` builds.

    ``name`` needs a limit in ``PLATFORM_PROVIDER_RATE_LIMITS``; the adapter gets the same
    rails, rate limits and 429 handling as Resend.
    """
    if name not in app.platform_settings.provider_rate_limits:
        from platform_tasks.errors import ConfigurationError

        raise ConfigurationError(
            f"provider {name!r} has no limit in PLATFORM_PROVIDER_RATE_LIMITS "
            f"(e.g. {name}=10/s); every provider needs one"
        )
    providers_of(app)[name] = factory


def _open_dispatcher(app: PlatformCelery) -> Dispatcher:
    settings: PlatformSettings = app.platform_settings
    limiter = RateLimiter(
        build_redis(settings),
        profile=settings.profile,
        provider_limits=settings.provider_rate_limits,
        tenant_limits=settings.tenant_rate_limits,
    )
    factories = {
        name: (lambda f=factory: f(settings)) for name, factory in providers_of(app).items()
    }
    return Dispatcher(limiter, factories)


dispatchers: ProcessState[Dispatcher] = ProcessState(
    "platform_notification_dispatcher", _open_dispatcher, Dispatcher.close
)
"""This process's dispatcher per app; ``app.close()`` closes its providers' HTTP
connections (an app made at run time, a test's, would otherwise keep a provider's
keep-alive connection open until the interpreter exits)."""


def dispatcher_for(app: PlatformCelery) -> Dispatcher:
    """This process's dispatcher for ``app`` (created on first use, again after a fork)."""
    return dispatchers.get(app)


def install(app: PlatformCelery) -> None:
    """Rail queues for workers without ``-Q``; the marketing yield in every worker."""
    providers_of(app)
    add_queue_source(app, queue_source)
    app.steps["consumer"].add(MarketingYield)
