"""Per-app state: one value per app object, plain apps included, gone with the app;
per-process state: made once in each process, closed by ``app.close()``."""

from __future__ import annotations

import gc
import os
import weakref
from typing import Any

import pytest
from celery import Celery
from celery._state import get_current_app

from platform_tasks.app_state import AppState, ProcessState
from platform_tasks.kernel import PlatformCelery
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing import create_test_app


def test_each_app_object_has_its_own_value() -> None:
    state: AppState[list[str]] = AppState("test_app_state_words")
    first, second = Celery("first", set_as_current=False), Celery("second", set_as_current=False)
    assert state.get(first) is None
    state.get_or_set(first, list).append("a")
    assert state.get(first) == ["a"]
    assert state.get(second) is None
    state.set(second, ["b"])
    assert state.get_or_set(second, list) == ["b"]
    assert state.get(first) == ["a"]


def test_a_value_that_cannot_be_made_is_not_kept() -> None:
    state: AppState[str] = AppState("test_app_state_failing")
    app = Celery("failing", set_as_current=False)

    def fail() -> str:
        raise RuntimeError("no value")

    with pytest.raises(RuntimeError):
        state.get_or_set(app, fail)
    assert state.get(app) is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_reads_what_its_parent_set() -> None:
    state: AppState[str] = AppState("test_app_state_forked")
    app = Celery("forked", set_as_current=False)
    state.set(app, "set before the fork")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        os.write(write, (state.get(app) or "").encode())
        os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 100) == b"set before the fork"
    finally:
        os.close(read)
        os.waitpid(pid, 0)


def test_an_app_whose_state_refers_back_to_it_is_still_garbage_collected() -> None:
    """create_app's hooks (the metrics hook) and fan-out binding hold the app: kept on the
    app, they do not keep it alive once nothing else refers to it."""
    previous = get_current_app()
    app: Any = create_test_app(
        "app_state_collected",
        settings=PlatformSettings.build(
            redis_url="redis://127.0.0.1:1/0",
            database_url="postgresql://u@127.0.0.1:1/db",
            profile="test",
        ),
    )
    state: AppState[object] = AppState("test_app_state_refers_back")
    state.set(app, [app])
    gone = weakref.ref(app)
    previous.set_current()
    del app
    gc.collect()
    assert gone() is None


class _Connection:
    """A stand-in for what a concern keeps open per process (a client, a session)."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_a_process_value_is_made_once_and_closed_by_the_app() -> None:
    state: ProcessState[_Connection] = ProcessState(
        "test_process_state_closed", _Connection, _Connection.close
    )
    app = PlatformCelery("closing", set_as_current=False)
    first = state.get(app)
    assert state.get(app) is first and first.app is app
    app.close()
    assert first.closed
    second = state.get(app)  # a later job of the same app opens a new one
    assert second is not first and not second.closed


def test_each_app_has_its_own_process_value() -> None:
    """An app made after another was collected (possibly at the same ``id``) never finds
    the other's value: the value is kept on the app itself."""
    state: ProcessState[_Connection] = ProcessState(
        "test_process_state_apps", _Connection, _Connection.close
    )
    for n in range(20):
        app = PlatformCelery(f"app{n}", set_as_current=False)
        assert state.get(app).app is app
        del app
        gc.collect()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_makes_its_own_process_value_and_leaves_the_parents_open() -> None:
    state: ProcessState[_Connection] = ProcessState(
        "test_process_state_forked", _Connection, _Connection.close
    )
    app = PlatformCelery("forked", set_as_current=False)
    parents = state.get(app)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        own = state.get(app)
        app.close()
        answer = f"{own is not parents} {own.closed} {parents.closed}"
        os.write(write, answer.encode())
        os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 100) == b"True True False"
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert state.get(app) is parents and not parents.closed
