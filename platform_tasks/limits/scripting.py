"""Scripts in pipelines at one round trip.

redis-py's ``Script`` called on a pipeline asks ``SCRIPT EXISTS`` before every
``execute``: a second round trip on each job's path. Here the script runs by ``EVALSHA``
inside the pipeline; a Redis that lost its script cache (restarted, flushed) answers
``NOSCRIPT``, the scripts are loaded and the pipeline is sent once more (its other
commands are idempotent where this is used).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import NoScriptError

__all__ = ["evalsha", "pipelined"]


def evalsha(pipe: Any, script: Any, keys: Sequence[Any], args: Sequence[Any]) -> None:
    """Queue ``script`` on ``pipe`` by its SHA."""
    pipe.evalsha(script.sha, len(keys), *keys, *args)


def pipelined(client: Any, build: Callable[[Any], None], scripts: Sequence[Any]) -> list[Any]:
    """Send the commands ``build`` queues in one round trip; reload ``scripts`` on NOSCRIPT."""
    for attempt in range(2):
        try:
            with client.pipeline(transaction=False) as pipe:
                build(pipe)
                return list(pipe.execute())
        except NoScriptError:
            if attempt:
                raise
            for script in scripts:
                script.sha = client.script_load(script.script)
    raise AssertionError("unreachable")
