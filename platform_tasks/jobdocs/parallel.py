"""Reading job files in several processes, as if in one.

Files are handed out in numbered batches through a pipe filled before forking: reads
of a few bytes from a pipe are atomic, so every batch goes to exactly one process, and
a process that is slowed down (by an import, or by a busy core) simply takes fewer.
Each child appends every finished batch to an anonymous file; this process reads what
is complete between its own batches, so little is left to read at the end. Results
come back in file order, and a child that fails is not trusted: the batches it took
are read again here, so the outcome (or the exception) is the serial one.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["PARALLEL_MIN_FILES", "analyse_in_processes", "default_workers"]

Result = TypeVar("Result")

PARALLEL_MIN_FILES = 200
"""Below this many selected files a run stays in one process: forking and passing the
results back costs more than reading the files."""

_RECORD = 4
"""Bytes per batch number in the work queue."""
_MIN_BATCH = 16
_MAX_BATCHES = 2048
"""At most 8 KiB of batch numbers: the queue is a pipe filled before forking, and every
platform with fork buffers at least 16 KiB in one."""
_HEADER = 8
"""Bytes of the length written before each batch in a child's results file."""


def default_workers(files: int) -> int:
    """One process per available core for a large selection, else one."""
    if files < PARALLEL_MIN_FILES or not hasattr(os, "fork"):
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - platforms without affinity masks
        cores = os.cpu_count() or 1
    return max(1, cores)


def _batch_size(files: int) -> int:
    return max(_MIN_BATCH, -(-files // _MAX_BATCHES))


class _ChildResults(Generic[Result]):
    """The batches one child has written so far, read back as they complete.

    Each batch is one write of a length and a pickle. On Linux the file is a memfd,
    whose size only ever covers bytes already copied in, so a batch whose whole length
    is visible is complete; elsewhere (a temporary file) it is read after the child
    has exited."""

    def __init__(self) -> None:
        if hasattr(os, "memfd_create"):
            self.fd = os.memfd_create("jobdocs-batches")
            self.incremental = True
        else:  # pragma: no cover - platforms without memfd
            import tempfile

            self.fd, name = tempfile.mkstemp(prefix="jobdocs-batches-")
            os.unlink(name)
            self.incremental = False
        self.offset = 0
        self.taken: list[int] = []

    def write(self, number: int, results: list[Result]) -> None:
        """In the child: append one finished batch."""
        payload = pickle.dumps((number, results), protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(len(payload).to_bytes(_HEADER, "little") + payload)
        while view:
            view = view[os.write(self.fd, view) :]

    def collect(
        self, done: dict[int, list[Result]], finish: Callable[[list[Result]], object]
    ) -> None:
        """In this process: take every complete batch written since the last call."""
        size = os.fstat(self.fd).st_size
        while self.offset + _HEADER <= size:
            length = int.from_bytes(os.pread(self.fd, _HEADER, self.offset), "little")
            end = self.offset + _HEADER + length
            if end > size:
                return
            number, results = pickle.loads(os.pread(self.fd, length, self.offset + _HEADER))
            finish(results)
            done[number] = results
            self.taken.append(number)
            self.offset = end

    def forget(self, done: dict[int, list[Result]]) -> None:
        """The child failed: drop what it returned, to be read again here."""
        for number in self.taken:
            done.pop(number, None)


def analyse_in_processes(
    files: Sequence[str],
    workers: int,
    analyse: Callable[[Sequence[str]], list[Result]],
    *,
    finish: Callable[[list[Result]], object],
    prepare: Callable[[list[Result]], object],
) -> list[Result]:
    """``analyse`` every batch of ``files`` in this process and ``workers - 1`` forked
    children and return the results in file order.

    ``prepare`` runs on a batch in the process that analysed it (a child included);
    ``finish`` runs on every batch in this process (its own right away, a child's once
    read back): work that must happen once, in one place."""
    size = _batch_size(len(files))
    batches = -(-len(files) // size)

    def prepared(number: int) -> list[Result]:
        results = analyse(files[number * size : (number + 1) * size])
        prepare(results)
        return results

    queue, queue_write = os.pipe()
    os.write(queue_write, b"".join(n.to_bytes(_RECORD, "little") for n in range(batches)))
    os.close(queue_write)
    children = [_start_child(queue, prepared) for _ in range(workers - 1)]
    done: dict[int, list[Result]] = {}
    try:
        while record := os.read(queue, _RECORD):
            number = int.from_bytes(record, "little")
            done[number] = prepared(number)
            finish(done[number])
            for _, child in children:
                if child.incremental:
                    child.collect(done, finish)
    finally:
        os.close(queue)
        # Children stop when the queue is empty; none is left behind, even on an error.
        statuses = [os.waitpid(pid, 0)[1] for pid, _ in children]
    for (_, child), status in zip(children, statuses, strict=True):
        if status == 0:
            child.collect(done, finish)
        else:
            child.forget(done)
        os.close(child.fd)
    ordered: list[Result] = []
    for number in range(batches):
        if number not in done:  # a batch a failed child had taken: analysed here
            done[number] = prepared(number)
            finish(done[number])
        ordered.extend(done[number])
    return ordered


def _start_child(
    queue: int, prepared: Callable[[int], list[Result]]
) -> tuple[int, _ChildResults[Result]]:
    """Fork a child that analyses batches off ``queue`` until it is empty, writing each
    batch's results to its file; return its pid and that file's reader."""
    child = _ChildResults[Result]()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child, reported through its file
        status = 1
        try:
            while record := os.read(queue, _RECORD):
                number = int.from_bytes(record, "little")
                child.write(number, prepared(number))
            status = 0
        finally:
            os._exit(status)
    return pid, child
