"""Per-app state: one value per app object, plain apps included, gone with the app."""

from __future__ import annotations

import gc
import os
import weakref
from typing import Any

import pytest
from celery import Celery
from celery._state import get_current_app

from platform_tasks.app_state import AppState
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
