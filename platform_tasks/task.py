"""``PlatformTask``: the Celery task base class that gives a handler the consumer guarantees.

A team writes::

    @app.task(base=PlatformTask, data_model=ChargeInvoice)
    def charge_invoice(envelope, tx): ...

and the task validates the envelope, claims the idempotency row in the transaction ``tx``
belongs to, retries with jittered backoff through the durable delay store, ends crash
loops and dead-letters what cannot succeed. The class itself stays thin: everything
happens in :class:`~platform_tasks.runner.JobRunner` and its collaborators.

Task options a PlatformTask understands besides Celery's own:

``data_model``
    the pydantic model (or ``dict``) of ``envelope.data``; default ``dict``.
``permanent_errors``
    a tuple of exception types that, like :class:`~platform_tasks.errors.PermanentError`,
    are dead-lettered at once instead of retried.

An unknown option is an error at declaration, as are Celery's own retry options
(``autoretry_for`` and friends): they would retry through worker-held ETAs and past
``max_attempts``, which is exactly what the platform replaces.
"""

from __future__ import annotations

from typing import Any, ClassVar

import celery
from celery import bootsteps
from pydantic import BaseModel

from platform_tasks.database import require_database_url
from platform_tasks.errors import ConfigurationError
from platform_tasks.runner import runner_for

PLATFORM_OPTIONS = frozenset({"data_model", "permanent_errors"})
"""The task options PlatformTask owns."""

CELERY_RETRY_OPTIONS = frozenset(
    {"autoretry_for", "dont_autoretry_for", "retry_backoff", "retry_backoff_max",
     "retry_jitter", "retry_kwargs"}
)  # fmt: skip
"""Celery retry options refused on a PlatformTask; use ``retry_policies`` instead."""

_DECORATOR_KEYS = frozenset(
    {"app", "name", "run", "_decorated", "_dump_pydantic_arguments", "__doc__", "__module__",
     "__annotations__", "__header__", "__wrapped__", "_decorated_fun", "__qualname__"}
)  # fmt: skip


class PlatformTask(celery.Task):  # type: ignore[misc]
    """Celery task base: ``handler(envelope, tx)`` with idempotency, retries, dead letters."""

    data_model: ClassVar[type[Any]] = dict
    permanent_errors: ClassVar[tuple[type[BaseException], ...]] = ()
    #: the handler takes (envelope, tx) but callers publish one argument: skip Celery's
    #: signature check of the published arguments
    typing = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_declaration(cls)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return runner_for(self.app).run(self, args, kwargs, self.request)

    def execute(self, envelope: Any, tx: Any) -> Any:
        """The work of one attempt, inside the transaction that holds the idempotency row.

        The default runs the handler. Subclasses (``NotificationTask``) wrap it: render,
        take rate-limit tokens, send. Raising :class:`~platform_tasks.errors.Throttled`
        reschedules the job without spending an attempt.
        """
        return self.run(envelope, tx)


def check_declaration(cls: type[Any]) -> None:
    """Reject unknown or conflicting options of a task declared with ``base=PlatformTask``."""
    namespace = vars(cls)
    name = namespace.get("name") or cls.__name__
    if namespace.get("_decorated"):
        for key in namespace:
            if key in _DECORATOR_KEYS or key in PLATFORM_OPTIONS or key.startswith("__"):
                continue
            if key in CELERY_RETRY_OPTIONS:
                raise ConfigurationError(
                    f"task {name!r}: option {key!r} is not supported on a PlatformTask; retries "
                    "follow the queue's RetryPolicy (create_app(retry_policies=...)) and "
                    "permanent_errors=(...) marks errors that must not be retried"
                )
            if not hasattr(celery.Task, key):
                known = ", ".join(sorted(PLATFORM_OPTIONS))
                raise ConfigurationError(
                    f"task {name!r}: unknown task option {key!r} (PlatformTask options: {known};"
                    " other options must be Celery task attributes)"
                )
    model = cls.data_model
    if not (model is dict or (isinstance(model, type) and issubclass(model, BaseModel))):
        raise ConfigurationError(
            f"task {name!r}: data_model must be a pydantic model class or dict, got {model!r}"
        )
    errors = cls.permanent_errors
    if not isinstance(errors, tuple) or not all(
        isinstance(err, type) and issubclass(err, BaseException) for err in errors
    ):
        raise ConfigurationError(
            f"task {name!r}: permanent_errors must be a tuple of exception classes, got {errors!r}"
        )


def platform_tasks_of(app: Any) -> list[str]:
    """Names of the app's tasks that are PlatformTasks."""
    return sorted(name for name, task in app.tasks.items() if isinstance(task, PlatformTask))


class RequireDatabaseStep(bootsteps.Step):  # type: ignore[misc]
    """Worker bootstep: refuse to start consumers of PlatformTasks without a database."""

    label = "platform database check"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        app = worker.app
        app.loader.import_default_modules()
        names = platform_tasks_of(app)
        if names:
            try:
                require_database_url(app.platform_settings)
            except ConfigurationError as exc:
                raise ConfigurationError(f"{exc} (needed by tasks: {', '.join(names)})") from None


def install(app: Any) -> None:
    """Refuse to start a worker whose PlatformTasks have no database."""
    app.steps["worker"].add(RequireDatabaseStep)
