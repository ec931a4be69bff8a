"""Static resolution of names and expressions to what they provably are.

The reader answers two questions without running anything: is this callee
``platform_tasks.jobs.define_job``, and what literal value does this argument have?
Both follow module-level bindings and imports, but only through files inside the
source roots; anything else resolves to :class:`Unresolved` with a reason a reviewer
can act on.
"""

from __future__ import annotations

import ast
import operator
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NamedTuple, TypeAlias

from platform_tasks.jobdocs.sources import ParsedModule, SourceIndex
from platform_tasks.jobdocs.symbols import (
    Binding,
    ClassBinding,
    ExprBinding,
    FunctionBinding,
    ImportBinding,
    ModuleSymbols,
    UnresolvableBinding,
    collect_symbols,
)

__all__ = [
    "DEFINE_JOB",
    "DefineJob",
    "External",
    "Opaque",
    "ProjectFunction",
    "ProjectModule",
    "Resolved",
    "Resolver",
    "Unresolved",
    "Value",
]

DEFINE_JOB = "platform_tasks.jobs.define_job"
"""The one callee whose calls count as job definitions."""

_TRUSTED_PACKAGES = frozenset({"platform_tasks"}) | frozenset(sys.stdlib_module_names)
_MAX_DEPTH = 64
_MAX_STR = 10_000
_MAX_INT = 2**63

LiteralValue: TypeAlias = str | int | float | bool | timedelta | None


class DefineJob(NamedTuple):
    """Provably ``platform_tasks.jobs.define_job``."""


class External(NamedTuple):
    """A dotted path into the standard library or platform-tasks: known by name, not read."""

    dotted: str


class ProjectModule(NamedTuple):
    name: str


class ProjectFunction(NamedTuple):
    """A function defined inside the roots; a call to it may hide a definition."""

    module: ParsedModule
    node: ast.FunctionDef | ast.AsyncFunctionDef


class Opaque(NamedTuple):
    """Something that exists but has no literal value (a class, a handler)."""

    what: str


class Value(NamedTuple):
    value: LiteralValue


class Unresolved(NamedTuple):
    """No static answer. ``hidden`` marks gaps that may hide a definition (code outside
    the roots, cycles, unreadable modules), as opposed to an ordinary runtime expression."""

    reason: str
    hidden: bool = False


Resolved: TypeAlias = (
    DefineJob | External | ProjectModule | ProjectFunction | Opaque | Value | Unresolved
)

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Not: operator.not_,
}
_ENV_LOOKUPS = frozenset({"os.getenv", "os.environ.get", "os.environ.__getitem__", "os.getenvb"})


def source_of(node: ast.AST, limit: int = 60) -> str:
    """A short rendering of an expression for reasons."""
    text = ast.unparse(node)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Resolver:
    """Resolves expressions of modules parsed from a :class:`SourceIndex`."""

    def __init__(self, index: SourceIndex) -> None:
        self.index = index
        self._symbols: dict[tuple[str, bool], ModuleSymbols] = {}
        self._stack: list[tuple[str, str]] = []
        self._on_stack: set[tuple[str, str]] = set()
        # Results of ``module_attribute`` that did not depend on the resolution stack
        # (no cycle, no depth limit on the way): thousands of job files importing the
        # same constants from ``_common`` resolve each constant once.
        self._attributes: dict[tuple[str, str], Resolved] = {}
        self._stack_dependent = 0
        self._outside_names: dict[str, Resolved] = {}
        self._outside_attributes: dict[tuple[str, str], Resolved] = {}
        self.reaches_define_job: dict[tuple[str, bool, str], bool] = {}
        """Wrapper analysis per project function (see ``definitions``), filled there."""

    # -- modules -----------------------------------------------------------------------

    def symbols(self, module: ParsedModule) -> ModuleSymbols:
        key = (module.file, module.standalone)
        cached = self._symbols.get(key)
        if cached is None:
            assert module.tree is not None
            cached = collect_symbols(
                module.tree,
                module.name,
                module.is_package,
                standalone=module.standalone,
                walrus=module.walrus,
            )
            self._symbols[key] = cached
        return cached

    def forget(self, path: str) -> None:
        """Release what was cached for the file at ``path`` (see :meth:`SourceIndex.forget`)."""
        self._symbols.pop((path, True), None)
        self._symbols.pop((path, False), None)
        self.index.forget(path)

    def _project_module(self, name: str) -> ParsedModule | Unresolved | None:
        file = self.index.file_for(name)
        if file is None:
            return None
        parsed = self.index.parse(file)
        if parsed.tree is None:
            return Unresolved(f"{self.index.relative(file)}: {parsed.syntax_error}", hidden=True)
        return parsed

    def _import_module(self, dotted: str) -> Resolved:
        if self.index.is_project_module(dotted):
            return ProjectModule(dotted)
        return self._outside(dotted)

    def _outside(self, dotted: str) -> Resolved:
        """A name outside the roots; the answer depends on ``dotted`` only, so it is
        computed once per run (every job file imports ``define_job`` and ``timedelta``)."""
        cached = self._outside_names.get(dotted)
        if cached is None:
            cached = self._outside_names[dotted] = self._outside_uncached(dotted)
        return cached

    def _outside_uncached(self, dotted: str) -> Resolved:
        if dotted.split(".")[0] in _TRUSTED_PACKAGES:
            return DefineJob() if dotted == DEFINE_JOB else External(dotted)
        outside = self.index.exists_outside_roots(dotted)
        if outside is not None:
            where = self.index.relative(outside)
            return Unresolved(
                f"{dotted} is imported from {where}, outside the source roots; not followed",
                hidden=True,
            )
        return Unresolved(f"{dotted} is outside the source roots; not followed", hidden=True)

    def _enter(self, module: str, name: str) -> Unresolved | None:
        """Push ``module.name`` on the resolution stack, or say why it cannot be: a cycle
        or the depth limit. Callers pop with :meth:`_leave` when this returned ``None``."""
        key = (module, name)
        if key in self._on_stack:
            start = self._stack.index(key)
            chain = " -> ".join(f"{m}.{n}" for m, n in [*self._stack[start:], key])
            self._stack_dependent += 1
            return Unresolved(f"import cycle: {chain}", hidden=True)
        if len(self._stack) >= _MAX_DEPTH:
            self._stack_dependent += 1
            return Unresolved(f"{module}.{name}: resolution deeper than {_MAX_DEPTH}", hidden=True)
        self._stack.append(key)
        self._on_stack.add(key)
        return None

    def _leave(self) -> None:
        self._on_stack.discard(self._stack.pop())

    def attribute(self, base: Resolved, attr: str) -> Resolved:
        """``base.attr`` for a resolved base."""
        if isinstance(base, ProjectModule):
            return self.module_attribute(base.name, attr)
        if isinstance(base, External):
            return self._outside(f"{base.dotted}.{attr}")
        if isinstance(base, Unresolved):
            return base
        return Unresolved(f"attribute {attr} of a computed value")

    def module_attribute(self, module_name: str, attr: str) -> Resolved:
        """What ``from module_name import attr`` yields, for a module inside the roots."""
        cached = self._attributes.get((module_name, attr))
        if cached is not None:
            return cached
        stop = self._enter(module_name, attr)
        if stop is not None:
            return stop
        before = self._stack_dependent
        try:
            result = self._module_attribute(module_name, attr)
        finally:
            self._leave()
        if self._stack_dependent == before:
            self._attributes[(module_name, attr)] = result
        return result

    def _module_attribute(self, module_name: str, attr: str) -> Resolved:
        parsed = self._project_module(module_name)
        if isinstance(parsed, Unresolved):
            return parsed
        if parsed is not None:
            binding = self.symbols(parsed).lookup(attr)
            if binding is not None:
                return self.binding(binding, parsed, attr)
        if self.index.is_project_module(f"{module_name}.{attr}"):
            return ProjectModule(f"{module_name}.{attr}")
        return Unresolved(f"{module_name} has no module-level name {attr}")

    def binding(self, binding: Binding, module: ParsedModule, name: str) -> Resolved:
        if isinstance(binding, ImportBinding):
            if binding.attr is None:
                return self._import_module(binding.module)
            if self.index.is_project_module(binding.module):
                return self.module_attribute(binding.module, binding.attr)
            return self._outside_attribute(binding.module, binding.attr)
        if isinstance(binding, ExprBinding):
            return self.expr(binding.node, module)
        if isinstance(binding, FunctionBinding):
            return ProjectFunction(module, binding.node)
        if isinstance(binding, ClassBinding):
            return Opaque(f"class {binding.node.name}")
        if isinstance(binding, UnresolvableBinding):
            return Unresolved(f"{module.name}: {binding.reason}", hidden=binding.escapes)
        raise AssertionError(binding)

    def _outside_attribute(self, module: str, attr: str) -> Resolved:
        """``from module import attr`` for a module outside the roots, once per pair."""
        key = (module, attr)
        cached = self._outside_attributes.get(key)
        if cached is None:
            cached = self._outside_attributes[key] = self._outside(f"{module}.{attr}")
        return cached

    def name(self, name: str, module: ParsedModule) -> Resolved:
        symbols = self.symbols(module)
        shallow = len(self._stack) < _MAX_DEPTH
        if shallow:
            settled = symbols.settled.get(name)
            if settled is not None:
                return settled  # type: ignore[return-value]
        binding = symbols.lookup(name)
        if binding is None:
            return Unresolved(f"{name} is not defined at module level in {module.name}")
        kind = binding.__class__
        if kind is ImportBinding:
            imported: ImportBinding = binding  # type: ignore[assignment]
            if not self.index.is_project_module(imported.module):
                if shallow:
                    # From outside the roots (``define_job``, ``timedelta``): it cannot
                    # lead back into them, so it needs no cycle bookkeeping.
                    if imported.attr is None:
                        result = self._outside(imported.module)
                    else:
                        result = self._outside_attribute(imported.module, imported.attr)
                    symbols.settled[name] = result
                    return result
            elif not self._stack and imported.attr:
                # A job file's `from beat_schedules._common import NIGHTLY`: with nothing
                # on the stack no cycle can pass through this name, so an answer already
                # settled for the imported attribute is the answer.
                cached = self._attributes.get((imported.module, imported.attr))
                if cached is not None:
                    return cached
        elif kind is ExprBinding:
            if shallow and isinstance(binding.node, ast.Constant):  # type: ignore[union-attr]
                result = symbols.settled[name] = self.binding(binding, module, name)
                return result
        else:
            return self.binding(binding, module, name)
        stop = self._enter(module.name, name)
        if stop is not None:
            return stop
        try:
            return self.binding(binding, module, name)
        finally:
            self._leave()

    # -- expressions -------------------------------------------------------------------

    def expr(self, node: ast.expr, module: ParsedModule) -> Resolved:
        """What ``node`` provably is when evaluated at module level of ``module``."""
        kind = node.__class__  # exact classes first: ast.parse makes no subclasses
        if kind is ast.Name:
            return self.name(node.id, module)  # type: ignore[attr-defined]
        if kind is ast.Call:
            return self._call(node, module)  # type: ignore[arg-type]
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str | int | float | bool) or node.value is None:
                return Value(node.value)
            return Unresolved(f"literal {source_of(node)} is not a documented field type")
        if isinstance(node, ast.Name):
            return self.name(node.id, module)
        if isinstance(node, ast.Attribute):
            return self.attribute(self.expr(node.value, module), node.attr)
        if isinstance(node, ast.Call):
            return self._call(node, module)
        if isinstance(node, ast.Subscript):
            base = self.expr(node.value, module)
            if isinstance(base, External) and base.dotted == "os.environ":
                return Unresolved(f"environment lookup {source_of(node)}")
            return Unresolved(f"subscript {source_of(node)} is evaluated at import time")
        if isinstance(node, ast.BinOp):
            return self._binop(node, module)
        if isinstance(node, ast.UnaryOp):
            return self._unary(node, module)
        return Unresolved(f"expression {source_of(node)} is evaluated at import time")

    def _call(self, node: ast.Call, module: ParsedModule) -> Resolved:
        callee = self.expr(node.func, module)
        if isinstance(callee, External):
            if callee.dotted in _ENV_LOOKUPS:
                return Unresolved(f"environment lookup {source_of(node)}")
            if callee.dotted == "datetime.timedelta":
                return self._timedelta(node, module)
        if isinstance(callee, Unresolved) and callee.hidden:
            return Unresolved(f"call {source_of(node)}: {callee.reason}", hidden=True)
        return Unresolved(f"call {source_of(node)} is evaluated at import time")

    def _timedelta(self, node: ast.Call, module: ParsedModule) -> Resolved:
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for arg in node.args:
            value = self._number(arg, module)
            if isinstance(value, Unresolved):
                return value
            args.append(value)
        for keyword in node.keywords:
            if keyword.arg is None:
                return Unresolved(f"call {source_of(node)} unpacks a mapping")
            value = self._number(keyword.value, module)
            if isinstance(value, Unresolved):
                return value
            kwargs[keyword.arg] = value
        try:
            return Value(timedelta(*args, **kwargs))
        except (TypeError, ValueError, OverflowError) as exc:
            return Unresolved(f"{source_of(node)} is not a valid timedelta: {exc}")

    def _number(self, node: ast.expr, module: ParsedModule) -> int | float | Unresolved:
        resolved = self.expr(node, module)
        if isinstance(resolved, Unresolved):
            return resolved
        value = resolved.value if isinstance(resolved, Value) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value
        return Unresolved(f"{source_of(node)} is not a number")

    def _binop(self, node: ast.BinOp, module: ParsedModule) -> Resolved:
        op = _BINARY.get(type(node.op))
        left, right = self.expr(node.left, module), self.expr(node.right, module)
        for side in (left, right):
            if isinstance(side, Unresolved):
                return side
        if op is None or not isinstance(left, Value) or not isinstance(right, Value):
            return Unresolved(f"expression {source_of(node)} is evaluated at import time")
        if _too_large(left.value, right.value, node.op):
            return Unresolved(f"expression {source_of(node)} is too large to evaluate")
        try:
            return _checked(op(left.value, right.value), node)
        except (TypeError, ValueError, ArithmeticError) as exc:
            return Unresolved(f"expression {source_of(node)} fails: {exc}")

    def _unary(self, node: ast.UnaryOp, module: ParsedModule) -> Resolved:
        op = _UNARY.get(type(node.op))
        operand = self.expr(node.operand, module)
        if isinstance(operand, Unresolved):
            return operand
        if op is None or not isinstance(operand, Value):
            return Unresolved(f"expression {source_of(node)} is evaluated at import time")
        try:
            return _checked(op(operand.value), node)
        except (TypeError, ValueError, ArithmeticError) as exc:
            return Unresolved(f"expression {source_of(node)} fails: {exc}")


def _too_large(left: LiteralValue, right: LiteralValue, op: ast.operator) -> bool:
    if not isinstance(op, ast.Mult):
        return False
    for text, count in ((left, right), (right, left)):
        if isinstance(text, str) and isinstance(count, int) and len(text) * count > _MAX_STR:
            return True
    return False


def _checked(result: object, node: ast.expr) -> Resolved:
    if isinstance(result, bool | str | float | timedelta) or result is None:
        if isinstance(result, str) and len(result) > _MAX_STR:
            return Unresolved(f"expression {source_of(node)} is too large to evaluate")
        return Value(result)
    if isinstance(result, int):
        if abs(result) >= _MAX_INT:
            return Unresolved(f"expression {source_of(node)} is too large to evaluate")
        return Value(result)
    return Unresolved(f"expression {source_of(node)} is evaluated at import time")
