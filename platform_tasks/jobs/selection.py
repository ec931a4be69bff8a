"""Which files under a jobs directory are job definition files, and what they are called.

Beat, the workers and the static ``jobs docs`` reader must agree on the set of job files
to the byte, or a reviewer reads docs for jobs that never run (or misses one that does).
So the rule lives here once, as a pure function of the directory listing and the globs:
no imports of job code, no settings lookups.

Glob matching uses :func:`fnmatch.fnmatchcase` against the file's path relative to the
root, written with ``/`` separators. ``*`` therefore also matches ``/``: ``billing/*``
selects every file below ``billing/`` at any depth, and ``*nightly.py`` matches a
``nightly.py`` in any directory. Matching is case-sensitive on every platform so a
selection does not change when a project moves between macOS and Linux.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path, PurePosixPath

__all__ = [
    "DEFAULT_INCLUDE",
    "is_ignored_name",
    "path_label",
    "select_job_files",
    "select_job_paths",
]

DEFAULT_INCLUDE: tuple[str, ...] = ("*.py",)
"""What is taken when no ``include`` glob is configured."""

_SKIPPED_DIRS = frozenset({"__pycache__"})


def is_ignored_name(name: str) -> bool:
    """Whether a file name is one of the built-in ignores, whatever the globs say.

    Private modules (``_common.py``) hold shared constants and helpers, test files belong
    to the test runner, and stubs are not importable: none of them may define a job.
    """
    if not name.endswith(".py"):
        return True
    if name.startswith(("_", ".")):
        return True
    return name == "conftest.py" or name.startswith("test_") or name.endswith("_test.py")


def _matcher(globs: Sequence[str]) -> Callable[[str], object] | None:
    """One compiled test for "matches any of ``globs``" (what :func:`fnmatchcase` does
    for each, as a single alternation), or ``None`` when there are none."""
    if not globs:
        return None
    return re.compile("|".join(fnmatch.translate(glob) for glob in globs)).match


def _walk_python_files(root: str) -> list[str]:
    """Paths of ``.py`` files below ``root``, relative to it, ``/``-separated.

    Plain strings, not ``Path`` objects: the static reader runs this over thousands of
    files and only the selected ones need to become paths.
    """
    found: list[str] = []
    start = len(root) + 1
    for dirpath, dirnames, filenames in os.walk(root):
        # Pruning in place keeps os.walk out of caches and hidden trees (.git, .venv);
        # directories starting with "_" are still entered on purpose.
        dirnames[:] = [
            name for name in dirnames if name not in _SKIPPED_DIRS and not name.startswith(".")
        ]
        prefix = dirpath[start:].replace(os.sep, "/")
        prefix = f"{prefix}/" if prefix else ""
        found.extend(prefix + name for name in filenames if name.endswith(".py"))
    return found


def select_job_files(
    root: Path, include: Sequence[str] = (), exclude: Sequence[str] = ()
) -> list[Path]:
    """Every job definition file under ``root``, as sorted absolute paths.

    ``include`` replaces the default ``*.py`` selection; ``exclude`` adds to the built-in
    ignores (see :func:`is_ignored_name`), which apply in both cases so an include glob
    cannot turn ``_common.py`` or a test module into a job. Only ``.py`` files are ever
    candidates: a job file must be an importable module. A missing root selects nothing;
    deciding whether that is an error is the caller's business.
    """
    return [Path(path) for path in select_job_paths(root, include, exclude)]


def select_job_paths(
    root: Path,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    *,
    candidates: Iterable[str] | None = None,
) -> list[str]:
    """:func:`select_job_files` as path strings (``str`` of each path it returns), for
    the static reader, which handles thousands of files and never needs the objects.

    ``candidates`` are the ``.py`` files below ``root`` (relative, ``/``-separated) when
    the caller has already walked it with the same pruning; otherwise it is walked here.
    """
    base = root.absolute()
    if not base.is_dir():
        return []
    wanted = tuple(include) or DEFAULT_INCLUDE
    # Every candidate ends in ".py", so the default include needs no test.
    included = None if wanted == DEFAULT_INCLUDE else _matcher(wanted)
    excluded = _matcher(exclude)
    selected: list[str] = []
    listed = _walk_python_files(str(base)) if candidates is None else candidates
    for relative in listed:
        if is_ignored_name(relative.rpartition("/")[2]):
            continue
        if included is not None and not included(relative):
            continue
        if excluded is not None and excluded(relative):
            continue
        selected.append(relative)
    # Sorted by path components, exactly as sorting the Path objects would: with NUL
    # (below every character a name can hold) for "/", string order is that order.
    selected.sort(key=lambda relative: relative.replace("/", "\0"))
    prefix = str(base) + os.sep
    return [prefix + relative.replace("/", os.sep) for relative in selected]


def path_label(root: Path, file: Path) -> str:
    """The job name inferred from a file's place under ``root``: ``billing/nightly.py``
    gives ``billing.nightly``.

    Directory names are kept exactly as written (``_internal/x.py`` gives
    ``_internal.x``) so two files never map to the same label by normalisation.
    Raises :class:`ValueError` when ``file`` is not below ``root``.
    """
    relative = PurePosixPath(file.absolute().relative_to(root.absolute()).as_posix())
    if relative.suffix != ".py":
        raise ValueError(f"{file} is not a .py file")
    return ".".join((*relative.parent.parts, relative.stem))
