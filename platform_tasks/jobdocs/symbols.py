"""Module-level name bindings of one parsed module, as far as they are unambiguous.

Resolution only trusts a name that is bound exactly once, unconditionally, at module
level: a second assignment, an ``if`` or a ``try`` means the value depends on what
happens at import time, which is precisely what the reader refuses to guess.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import NamedTuple, TypeAlias

__all__ = [
    "Binding",
    "ClassBinding",
    "ExprBinding",
    "FunctionBinding",
    "ImportBinding",
    "ModuleSymbols",
    "UnresolvableBinding",
    "absolute_module",
    "collect_symbols",
    "standalone_relative_import",
]


class ExprBinding(NamedTuple):
    """``NAME = <expr>``: resolved lazily, in the module that holds it."""

    node: ast.expr


class ImportBinding(NamedTuple):
    """``import module as NAME`` (``attr`` is None) or ``from module import attr as NAME``."""

    module: str
    attr: str | None
    line: int


class FunctionBinding(NamedTuple):
    node: ast.FunctionDef | ast.AsyncFunctionDef


class ClassBinding(NamedTuple):
    node: ast.ClassDef


class UnresolvableBinding(NamedTuple):
    """A binding whose value depends on import-time behaviour; carries the reason."""

    reason: str
    escapes: bool = False


Binding: TypeAlias = (
    ExprBinding | ImportBinding | FunctionBinding | ClassBinding | UnresolvableBinding
)


class ModuleSymbols:
    """The module-level names of one module and the modules it star-imports (a plain
    class: one is made per parsed file)."""

    __slots__ = ("bindings", "failed_star", "settled", "star_modules")

    def __init__(self, star_modules: list[str], failed_star: str | None) -> None:
        self.bindings: dict[str, Binding] = {}
        self.star_modules = star_modules
        self.failed_star = failed_star
        """Why a star import of this module cannot be followed (it fails at import time)."""
        self.settled: dict[str, object] = {}
        """What the resolver found for names whose answer cannot depend on how they were
        reached (imports from outside the roots, literals): a job file names
        ``timedelta`` or ``define_job`` several times."""

    def lookup(self, name: str) -> Binding | None:
        found = self.bindings.get(name)
        if found is not None:
            return found
        if self.failed_star is not None:
            return UnresolvableBinding(f"{name} may come from {self.failed_star}", escapes=True)
        if len(self.star_modules) == 1:
            return ImportBinding(self.star_modules[0], name, 0)
        if self.star_modules:
            return UnresolvableBinding(f"{name} may come from several star imports")
        return None


def absolute_module(current: str, is_package: bool, level: int, module: str | None) -> str | None:
    """The absolute target of a (possibly relative) ``from`` import, or ``None`` when a
    relative import climbs above the top-level package."""
    if level == 0:
        return module
    package = current.split(".") if is_package else current.split(".")[:-1]
    if level - 1 >= len(package):
        return None
    base = package[: len(package) - (level - 1)]
    if module:
        base = [*base, *module.split(".")]
    return ".".join(base) if base else None


def standalone_relative_import(line: int) -> str:
    """Why a relative import in a job file gives no value: what start-up will do with it."""
    return (
        f"relative import at line {line} fails when discovery imports the job file "
        "(job files are imported on their own, not as part of a package); "
        "import by absolute name, e.g. from beat_schedules._common import NAME"
    )


class _Collector:
    def __init__(self, module: str, is_package: bool, standalone: bool) -> None:
        self.module = module
        self.is_package = is_package
        self.standalone = standalone
        self.seen: dict[str, list[tuple[Binding, bool]]] = {}
        self.star_modules: list[str] = []
        self.failed_star: str | None = None

    def bind(self, name: str, binding: Binding, conditional: bool) -> None:
        self.seen.setdefault(name, []).append((binding, conditional))

    def statements(self, body: list[ast.stmt], conditional: bool) -> None:
        for stmt in body:
            self.statement(stmt, conditional)

    def statement(self, stmt: ast.stmt, conditional: bool) -> None:
        kind = stmt.__class__
        if kind in _BINDS_NOTHING:
            return
        if kind is ast.ImportFrom:  # the usual job file: imports, a function, a call
            self.import_from(stmt, conditional)  # type: ignore[arg-type]
            return
        if kind is ast.FunctionDef:
            self.bind(stmt.name, FunctionBinding(stmt), conditional)  # type: ignore[attr-defined, arg-type]
            return
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    self.bind(
                        alias.asname, ImportBinding(alias.name, None, stmt.lineno), conditional
                    )
                else:
                    top = alias.name.split(".")[0]
                    self.bind(top, ImportBinding(top, None, stmt.lineno), conditional)
        elif isinstance(stmt, ast.ImportFrom):
            self.import_from(stmt, conditional)
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                self.target(target, stmt.value, conditional)
        elif isinstance(stmt, ast.AnnAssign):
            if stmt.value is not None:
                self.target(stmt.target, stmt.value, conditional)
        elif isinstance(stmt, ast.AugAssign):
            if isinstance(stmt.target, ast.Name):
                self.bind(stmt.target.id, UnresolvableBinding("modified in place"), conditional)
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            self.bind(stmt.name, FunctionBinding(stmt), conditional)
        elif isinstance(stmt, ast.ClassDef):
            self.bind(stmt.name, ClassBinding(stmt), conditional)
        elif isinstance(stmt, ast.Delete):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    self.bind(target.id, UnresolvableBinding("deleted at import"), conditional)
        else:
            self.compound(stmt)

    def compound(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.If) and _is_type_checking(stmt.test):
            return
        for attr in ("body", "orelse", "finalbody"):
            self.statements(getattr(stmt, attr, []), conditional=True)
        for handler in getattr(stmt, "handlers", []):
            self.statements(handler.body, conditional=True)
        for case in getattr(stmt, "cases", []):
            self.statements(case.body, conditional=True)
        for target in _loop_or_with_targets(stmt):
            self.bind(target, UnresolvableBinding("bound by a loop or with"), True)

    def import_from(self, stmt: ast.ImportFrom, conditional: bool) -> None:
        if stmt.level and self.standalone:
            reason = f"relative import at line {stmt.lineno} fails at start-up"
            for alias in stmt.names:
                if alias.name == "*":
                    self.failed_star = self.failed_star or f"a star import: {reason}"
                else:
                    unresolvable = UnresolvableBinding(reason, escapes=True)
                    self.bind(alias.asname or alias.name, unresolvable, conditional)
            return
        if stmt.level:
            target = absolute_module(self.module, self.is_package, stmt.level, stmt.module)
        else:
            target = stmt.module
        for alias in stmt.names:
            if target is None:
                binding: Binding = UnresolvableBinding(
                    f"relative import at line {stmt.lineno} climbs above the source roots",
                    escapes=True,
                )
                if alias.name != "*":
                    self.bind(alias.asname or alias.name, binding, conditional)
                continue
            if alias.name == "*":
                self.star_modules.append(target)
                continue
            self.bind(
                alias.asname or alias.name,
                ImportBinding(target, alias.name, stmt.lineno),
                conditional,
            )

    def target(self, target: ast.expr, value: ast.expr, conditional: bool) -> None:
        if isinstance(target, ast.Name):
            self.bind(target.id, ExprBinding(value), conditional)
        elif isinstance(target, ast.Tuple | ast.List):
            for element in ast.walk(target):
                if isinstance(element, ast.Name):
                    self.bind(element.id, UnresolvableBinding("bound by unpacking"), conditional)

    def result(self) -> ModuleSymbols:
        symbols = ModuleSymbols(self.star_modules, self.failed_star)
        for name, entries in self.seen.items():
            if len(entries) == 1 and not entries[0][1]:
                symbols.bindings[name] = entries[0][0]
            elif len(entries) == 1:
                symbols.bindings[name] = UnresolvableBinding(
                    f"{name} is bound conditionally at import time"
                )
            else:
                symbols.bindings[name] = UnresolvableBinding(
                    f"{name} is bound {len(entries)} times at module level"
                )
        return symbols


_BINDS_NOTHING: frozenset[type] = frozenset(
    {
        ast.Expr,
        ast.Pass,
        ast.Raise,
        ast.Assert,
        ast.Global,
        ast.Nonlocal,
        ast.Return,
        ast.Break,
        ast.Continue,
    }
)
"""Simple statements that bind no module-level name (every job file ends in an ``Expr``:
its ``define_job(...)`` call)."""


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _loop_or_with_targets(node: ast.AST) -> list[str]:
    targets: list[ast.expr] = []
    if isinstance(node, ast.For | ast.AsyncFor):
        targets.append(node.target)
    elif isinstance(node, ast.With | ast.AsyncWith):
        targets.extend(item.optional_vars for item in node.items if item.optional_vars)
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _walrus_targets(body: list[ast.stmt]) -> Iterator[str]:
    """Names that assignment expressions bind in the module's own scope: anywhere the
    module evaluates at import time (comprehensions included), but not inside function,
    lambda or class bodies, which have scopes of their own."""
    pending: list[ast.AST] = list(body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
            yield node.target.id
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            arguments = node.args
            pending.extend(arguments.defaults)
            pending.extend(d for d in arguments.kw_defaults if d is not None)
            if not isinstance(node, ast.Lambda):
                pending.extend(node.decorator_list)
                pending.extend(a.annotation for a in _all_args(arguments) if a.annotation)
                if node.returns is not None:
                    pending.append(node.returns)
        elif isinstance(node, ast.ClassDef):
            pending.extend(node.decorator_list)
            pending.extend(node.bases)
            pending.extend(keyword.value for keyword in node.keywords)
        else:
            pending.extend(ast.iter_child_nodes(node))


def _all_args(arguments: ast.arguments) -> list[ast.arg]:
    extra = [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
    return [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, *extra]


def collect_symbols(
    tree: ast.Module,
    module: str,
    is_package: bool,
    *,
    standalone: bool = False,
    walrus: bool = False,
) -> ModuleSymbols:
    """The unambiguous module-level bindings of ``tree``.

    ``standalone`` is for a job file as discovery imports it (outside any package): its
    relative imports bind nothing, since they fail at start-up. ``walrus`` says the
    source may hold assignment expressions; a name one of them binds is never trusted.
    """
    collector = _Collector(module, is_package, standalone)
    collector.statements(tree.body, conditional=False)
    if walrus:
        for name in _walrus_targets(tree.body):
            reason = "bound by an assignment expression (:=) at import time"
            collector.bind(name, UnresolvableBinding(reason), False)
    return collector.result()
