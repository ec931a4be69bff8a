"""The platform settings the console's actions run with, and errors made safe to show."""

from __future__ import annotations

from functools import lru_cache

from platform_tasks.settings import PlatformSettings, without_secrets

__all__ = ["platform_settings", "safe_error"]


@lru_cache(maxsize=1)
def platform_settings() -> PlatformSettings:
    """``PlatformSettings.from_env()`` once per process: the database the operations log
    and bulk actions use, and the Redis and broker that replays publish to and pauses
    flag. In a mounted console these ``PLATFORM_*`` variables must name the same database
    as the router's alias."""
    return PlatformSettings.from_env()


def safe_error(exc: BaseException) -> str:
    """One line for the page: the error, with every configured URL's password masked."""
    text = str(exc).strip() or type(exc).__name__
    try:
        settings = platform_settings()
    except Exception:
        return text
    return without_secrets(text, settings.database_url, settings.redis_url, settings.broker_url)
