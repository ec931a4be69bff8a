"""The project's source files as the static reader may see them: parsed, never imported.

Only files below the declared source roots are followed when a job file imports
something; everything else is reported as outside the roots instead of being read.
That boundary is what keeps the reader from wandering into business code, vendored
packages or the virtualenv.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ParsedModule", "SourceIndex", "module_name_for"]


@dataclass(frozen=True)
class ParsedModule:
    """A module inside the roots, or the syntax error that stopped its parsing."""

    name: str
    file: Path
    tree: ast.Module | None
    syntax_error: str | None = None
    standalone: bool = False
    """True for a selected job file as discovery imports it: under a generated name that
    belongs to no package, so a relative import in it fails at start-up."""

    @property
    def is_package(self) -> bool:
        return self.file.name == "__init__.py"


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


def _python_files(root: Path) -> list[str]:
    """Every ``.py`` file below ``root`` as a path string, in :class:`~pathlib.Path` order
    (component by component, so ``x/__init__.py`` comes before ``x.py``). Strings, not
    paths: the index visits every file of the roots, and only a few are ever looked up."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
        prefix = dirpath + os.sep
        found.extend(prefix + name for name in filenames if name.endswith(".py"))
    found.sort(key=lambda path: path.split(os.sep))
    return found


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
        self._parsed: dict[Path, ParsedModule] = {}
        self._packages: set[str] = set()
        self._bases = [str(self.project_dir), *(str(root.parent) for root in self.roots)]
        for root in self.roots:
            if not root.is_dir():
                continue
            for file in _python_files(root):
                # One pass when the root's parent is the project directory (the usual
                # layout): both bases give the same name for the same file.
                for base in dict.fromkeys((self._bases[0], str(root.parent))):
                    name = _name_from_parts(_parts_below(base, file))
                    if name is not None:
                        self._by_name.setdefault(name, file)
                        parts = name.split(".")
                        self._packages.update(".".join(parts[:i]) for i in range(1, len(parts)))

    def inside_roots(self, file: Path) -> bool:
        path = file.absolute()
        return any(path == root or root in path.parents for root in self.roots)

    def file_for(self, module: str) -> Path | None:
        """The file of a module inside the roots, or ``None`` when it is not one of ours."""
        file = self._by_name.get(module)
        return None if file is None else Path(file)

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

    def name_of(self, file: Path) -> str:
        """The module name used for ``file``'s own relative imports."""
        path = str(file.absolute())
        for base in self._bases:
            name = _name_from_parts(_parts_below(base, path))
            if name is not None:
                return name
        return file.stem

    def parse(self, file: Path) -> ParsedModule:
        path = file.absolute()
        cached = self._parsed.get(path)
        if cached is not None:
            return cached
        name = self.name_of(path)
        try:
            source = path.read_bytes()
            tree = ast.parse(source, filename=str(path))
        except SyntaxError as exc:
            parsed = ParsedModule(name, path, None, _describe_syntax_error(exc))
        except (OSError, ValueError) as exc:
            parsed = ParsedModule(name, path, None, f"cannot be read: {exc}")
        else:
            parsed = ParsedModule(name, path, tree)
        self._parsed[path] = parsed
        return parsed

    def forget(self, file: Path) -> None:
        """Drop a parsed tree; a later :meth:`parse` reads the file again. Keeps memory flat
        when thousands of job files are read once each."""
        self._parsed.pop(file.absolute(), None)

    def relative(self, file: Path) -> str:
        """How outputs name a file: relative to the project when possible, ``/``-separated."""
        path = file.absolute()
        parts = _parts_below(self._bases[0], str(path))
        return "/".join(parts) if parts else path.as_posix()
