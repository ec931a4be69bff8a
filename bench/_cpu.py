"""CPU seconds used by a tree of processes, read from ``/proc`` (Linux only).

On a shared machine a run's wall time follows everyone else's load; the CPU the bench's
own processes used does much less, so a bench can say where its time went (the workers,
PostgreSQL) by reading the counters before and after a run. A process's own time
(``utime`` + ``stime``) plus that of its children that exited and were waited for
(``cutime`` + ``cstime``: a PostgreSQL backend whose connection closed lands in the
postmaster's), summed over the process and its living descendants.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["postmaster_pid", "tree_cpu_seconds"]

_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # exited meanwhile
        return None
    return text[text.rindex(")") + 2 :].split()  # the fields after "(comm)"


def _children() -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None:
                found.setdefault(int(fields[1]), []).append(int(entry))
    return found


def tree_cpu_seconds(roots: Iterable[int]) -> float:
    """CPU seconds of ``roots`` and every living descendant, with their reaped children."""
    children = _children()
    todo = list(roots)
    ticks = 0
    while todo:
        pid = todo.pop()
        fields = _stat(pid)
        if fields is not None:
            ticks += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
        todo.extend(children.get(pid, ()))
    return ticks / _TICKS


def postmaster_pid(data_dir: Path) -> int:
    """The pid of the PostgreSQL cluster running in ``data_dir``."""
    return int((data_dir / "postmaster.pid").read_text().split()[0])
