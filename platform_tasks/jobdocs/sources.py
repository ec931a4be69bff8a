"""The project's source files as the static reader may see them: parsed, never imported.

Only files below the declared source roots are followed when a job file imports
something; everything else is reported as outside the roots instead of being read.
That boundary is what keeps the reader from wandering into business code, vendored
packages or the virtualenv.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

__all__ = ["ParsedModule", "SourceIndex", "module_name_for"]


class ParsedModule(NamedTuple):
    """A module inside the roots, or the syntax error that stopped its parsing.

    ``file`` is the absolute path as a string: thousands of job files pass through
    here, and only a handful of paths are ever shown or compared."""

    name: str
    file: str
    tree: ast.Module | None
    syntax_error: str | None = None
    standalone: bool = False
    """True for a selected job file as discovery imports it: under a generated name that
    belongs to no package, so a relative import in it fails at start-up."""
    walrus: bool = False
    """The source contains ``:=``, so an assignment expression may bind a module-level
    name (looked for only then: a text search costs nothing, a walk does)."""

    @property
    def is_package(self) -> bool:
        return os.path.basename(self.file) == "__init__.py"


def module_name_for(base: Path, file: Path) -> str | None:
    """The dotted module name of ``file`` when ``base`` is on ``sys.path``, if it has one."""
    return _name_from_parts(_parts_below(str(base), str(file)))


def _parts_below(base: str, file: str) -> list[str] | None:
    """``file``'s path components below ``base`` (both absolute, normalised by
    :class:`~pathlib.Path`), or ``None`` when it is not below. String work only: this
    runs for every file of the tree, where ``Path.relative_to`` is the hot spot."""
    prefix = base if base.endswith(os.sep) else base + os.sep
    if not file.startswith(prefix):
        return None
    return file[len(prefix) :].split(os.sep)


def _name_from_parts(parts: list[str] | None) -> str | None:
    if not parts:
        return None
    stem, suffix = os.path.splitext(parts[-1])
    parts = [*parts[:-1], stem] if suffix else list(parts)
    if parts[-1] == "__init__":
        parts.pop()
    if not parts or not all(part.isidentifier() for part in parts):
        return None
    return ".".join(parts)


def _module_dirs(root: Path) -> Iterator[tuple[str, list[str]]]:
    """``(directory, module stems)`` for every directory below ``root`` holding ``.py``
    files, skipping caches and hidden trees. Unsorted: the index orders by rank only
    where two files claim the same name."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
        stems = [name[:-3] for name in filenames if name.endswith(".py")]
        if stems:
            yield dirpath, stems


def _read(path: str) -> bytes:
    """The file's bytes with plain system calls: a job file is a few hundred bytes, and
    the reader opens thousands (half the cost of a file object)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.read(fd, 8192)
        if len(data) < 8192:
            return data
        chunks = [data]
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _describe_syntax_error(exc: SyntaxError) -> str:
    where = f"line {exc.lineno}" if exc.lineno else "unknown line"
    return f"syntax error at {where}: {exc.msg}"


class SourceIndex:
    """Maps module names to files below the roots and parses each file at most once.

    A file is reachable under two names: relative to the project directory (the usual
    ``sys.path`` entry, giving ``beat_schedules._common``) and relative to its root's
    parent (a ``src/`` layout declaring ``src/mypkg`` as root gives ``mypkg.x``).
    """

    def __init__(self, project_dir: Path, roots: list[Path]) -> None:
        self.project_dir = project_dir.absolute()
        self.roots = [root.absolute() for root in roots]
        self._by_name: dict[str, str] = {}
        self._parsed: dict[tuple[str, bool], ParsedModule] = {}
        self._prefixes: dict[str, list[str]] = {}
        self._listings: dict[str, list[tuple[str, list[str]]]] = {}
        self._packages: set[str] = set()
        self._bases = [str(self.project_dir), *(str(root.parent) for root in self.roots)]
        # Where a name was first claimed from: (root index, base index), for ties.
        self._origins: dict[str, tuple[int, int]] = {}
        for root_index, root in enumerate(self.roots):
            if not root.is_dir():
                continue
            # One pass when the root's parent is the project directory (the usual
            # layout): both bases give the same name for the same file.
            bases = list(dict.fromkeys((self._bases[0], str(root.parent))))
            listing = self._listings[str(root)] = list(_module_dirs(root))
            for dirpath, stems in listing:
                for base_index, base in enumerate(bases):
                    self._add_directory(dirpath, stems, base, (root_index, base_index))

    def _add_directory(
        self, dirpath: str, stems: list[str], base: str, origin: tuple[int, int]
    ) -> None:
        """Name the modules of one directory as seen from ``base``: the directory's
        components are checked once, not once per file (a tree may hold thousands)."""
        parts = [] if dirpath == base else _parts_below(base, dirpath)
        if parts is None or not all(part.isidentifier() for part in parts):
            return
        prefix = ".".join(parts) + "." if parts else ""
        depth = 0  # how many leading components are packages, as names below show
        for stem in stems:
            if stem == "__init__":
                if not parts:
                    continue
                name, depth = prefix[:-1], max(depth, len(parts) - 1)
            elif stem.isidentifier():
                name, depth = prefix + stem, len(parts)
            else:
                continue
            self._claim(name, dirpath + os.sep + stem + ".py", origin)
        self._packages.update(".".join(parts[:i]) for i in range(1, depth + 1))

    def _claim(self, name: str, file: str, origin: tuple[int, int]) -> None:
        """Record ``file`` as ``name`` unless a file that comes first already has it: first
        by root, then by path component by component (``x/__init__.py`` before ``x.py``,
        as Python prefers the package), then by base."""
        held = self._by_name.get(name)
        if held is not None:
            previous = self._origins[name]
            mine = (origin[0], file.split(os.sep), origin[1])
            if (previous[0], held.split(os.sep), previous[1]) <= mine:
                return
        self._by_name[name] = file
        self._origins[name] = origin

    def python_files(self, directory: Path) -> list[str] | None:
        """The ``.py`` files below ``directory`` (relative, ``/``-separated) when it is one
        of the roots, as this index already walked it with the same pruning as the job
        file selection; ``None`` otherwise. The jobs directory is usually a root, so the
        tree is walked once, not twice."""
        top = str(directory.absolute())
        listing = self._listings.get(top)
        if listing is None:
            return None
        start = len(top) + 1
        found: list[str] = []
        for dirpath, stems in listing:
            prefix = dirpath[start:].replace(os.sep, "/") + "/" if dirpath != top else ""
            found.extend(prefix + stem + ".py" for stem in stems)
        return found

    def inside_roots(self, file: Path) -> bool:
        path = file.absolute()
        return any(path == root or root in path.parents for root in self.roots)

    def file_for(self, module: str) -> str | None:
        """The file of a module inside the roots, or ``None`` when it is not one of ours."""
        return self._by_name.get(module)

    def is_project_module(self, module: str) -> bool:
        """Whether ``module`` is a module or (possibly namespace) package inside the roots."""
        return module in self._by_name or module in self._packages

    def exists_outside_roots(self, module: str) -> Path | None:
        """The project file a module name would load from, when it lies outside the roots.

        Used only to word the reason precisely; the file is never read.
        """
        relative = Path(*module.split("."))
        for candidate in (
            self.project_dir / relative.with_suffix(".py"),
            self.project_dir / relative / "__init__.py",
        ):
            if candidate.is_file() and not self.inside_roots(candidate):
                return candidate
        return None

    def name_of(self, path: str) -> str:
        """The module name used for the relative imports of the file at ``path``
        (absolute)."""
        directory, _, filename = path.rpartition(os.sep)
        if filename.endswith(".py") and not filename.startswith("."):
            stem = filename[:-3]  # what splitext gives, without its generic path handling
        else:
            stem = os.path.splitext(filename)[0]
        prefixes = self._prefixes.get(directory)
        if prefixes is None:
            prefixes = self._prefixes[directory] = self._directory_prefixes(directory)
        for prefix in prefixes:
            # The same rule as module_name_for, with the directory part worked out once.
            if stem == "__init__":
                if prefix:
                    return prefix[:-1]
            elif stem.isidentifier():
                return prefix + stem
        return stem

    def _directory_prefixes(self, directory: str) -> list[str]:
        """``"a.b."`` for each base ``directory`` lies below as package ``a.b`` (``""``
        when it is the base itself), in base order."""
        prefixes = []
        for base in self._bases:
            parts = [] if directory == base else _parts_below(base, directory)
            if parts is not None and all(part.isidentifier() for part in parts):
                prefixes.append("".join(part + "." for part in parts))
        return prefixes

    def parse(self, path: str, *, standalone: bool = False) -> ParsedModule:
        """The parsed module at ``path`` (absolute, as :func:`os.walk` and the selection
        spell it); ``standalone`` marks a selected job file as discovery imports it."""
        key = (path, standalone)
        cached = self._parsed.get(key)
        if cached is not None:
            return cached
        other = self._parsed.get((path, not standalone))
        if other is not None:
            parsed = other._replace(standalone=standalone)
            self._parsed[key] = parsed
            return parsed
        name = self.name_of(path)
        try:
            source = _read(path)
            tree = ast.parse(source, filename=path)
        except SyntaxError as exc:
            parsed = ParsedModule(name, path, None, _describe_syntax_error(exc), standalone)
        except (OSError, ValueError) as exc:
            parsed = ParsedModule(name, path, None, f"cannot be read: {exc}", standalone)
        else:
            parsed = ParsedModule(name, path, tree, None, standalone, b":=" in source)
        self._parsed[key] = parsed
        return parsed

    def forget(self, path: str) -> None:
        """Drop what :meth:`parse` kept for ``path``; a later call reads the file again.
        Keeps memory flat when thousands of job files are read once each."""
        self._parsed.pop((path, False), None)
        self._parsed.pop((path, True), None)

    def relative(self, path: str | Path) -> str:
        """How outputs name a file: relative to the project when possible, ``/``-separated."""
        text = path if isinstance(path, str) else str(path.absolute())
        parts = _parts_below(self._bases[0], text)
        return "/".join(parts) if parts else Path(text).as_posix()
