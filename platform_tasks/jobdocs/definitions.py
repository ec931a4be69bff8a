"""Finding the ``define_job`` calls a job file makes at import time, by provenance only.

A call counts when its callee resolves to ``platform_tasks.jobs.define_job``; the name
written at the call site is irrelevant, so aliases count and look-alikes do not. Calls
into project functions that themselves reach ``define_job`` are wrappers: they define a
job with arguments the reader does not evaluate, which is missing evidence, not a guess.
"""

from __future__ import annotations

import ast
from collections import deque

from platform_tasks.jobdocs.resolve import (
    DefineJob,
    ProjectFunction,
    Resolver,
    Unresolved,
    source_of,
)
from platform_tasks.jobdocs.sources import ParsedModule

__all__ = ["FoundCalls", "find_definition_calls", "import_time_calls"]

_MAX_WRAPPER_DEPTH = 16


class FoundCalls:
    """The definitions of one file and the calls that may hide further ones.

    A plain class: one is made per job file, and a dataclass costs a millisecond to
    define at every start-up for nothing this needs."""

    __slots__ = ("definitions", "hidden", "wrappers")

    def __init__(self) -> None:
        self.definitions: list[ast.Call] = []
        self.wrappers: list[str] = []
        self.hidden: list[str] = []


_SCALAR_FIELDS = frozenset(
    {
        "name",
        "asname",
        "id",
        "attr",
        "arg",
        "module",
        "level",
        "names",
        "ctx",
        "op",
        "ops",
        "kind",
        "conversion",
        "is_async",
        "simple",
        "type_comment",
        "tag",
        "rest",
        "kwd_attrs",
        "lineno",
        "n",
        "s",
    }
)
"""Fields that hold identifiers, flags or operator singletons: never a call below them."""

_LEAVES: frozenset[type] = frozenset(
    {
        ast.Import,
        ast.ImportFrom,
        ast.Pass,
        ast.Global,
        ast.Nonlocal,
        ast.Break,
        ast.Continue,
        ast.Name,
        ast.Constant,
        ast.alias,
    }
    | {
        cls
        for cls in vars(ast).values()
        if isinstance(cls, type)
        and issubclass(
            cls,
            ast.expr_context | ast.operator | ast.unaryop | ast.cmpop | ast.boolop | ast.pattern,
        )
    }
)
"""Nodes that never contain a call (patterns included: a ``case`` pattern is a literal
or a dotted name; its guard is visited). Every job file has several."""

_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}
"""The fields of each node type that may hold nodes, filled on first sight of a type."""


def _child_fields(kind: type) -> tuple[str, ...]:
    fields = _CHILD_FIELDS.get(kind)
    if fields is None:
        if kind in _LEAVES or not issubclass(kind, ast.AST):
            fields = ()
        else:
            fields = tuple(name for name in kind._fields if name not in _SCALAR_FIELDS)
        _CHILD_FIELDS[kind] = fields
    return fields


def import_time_calls(tree: ast.Module) -> list[ast.Call]:
    """Calls evaluated when the module is imported: module and class bodies, decorators
    and default values, but not function bodies or lambdas (those run later, if ever).

    Breadth-first, children in :func:`ast.iter_child_nodes` order. Every import-time
    node of every job file passes through here, so node types are looked up in
    per-type tables rather than tested one ``isinstance`` at a time, the nodes of every
    job file (calls, their keywords, expression statements) are taken apart directly,
    and nodes that can hold no call (leaves, a keyword whose value is one) are never
    queued: skipping them changes nothing in the order of the rest."""
    leaves = _LEAVES
    calls: list[ast.Call] = []
    pending: deque[ast.AST] = deque(stmt for stmt in tree.body if stmt.__class__ not in leaves)
    push, pop = pending.append, pending.popleft
    call_kind, keyword_kind, expr_kind = ast.Call, ast.keyword, ast.Expr
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    while pending:
        node = pop()
        kind = node.__class__
        if kind is call_kind:
            calls.append(node)  # type: ignore[arg-type]
            func = node.func  # type: ignore[attr-defined]
            if func.__class__ not in leaves:
                push(func)
            for arg in node.args:  # type: ignore[attr-defined]
                if arg.__class__ not in leaves:
                    push(arg)
            for keyword in node.keywords:  # type: ignore[attr-defined]
                if keyword.value.__class__ not in leaves:
                    push(keyword)
            continue
        if kind is keyword_kind or kind is expr_kind:
            value = node.value  # type: ignore[attr-defined]
            if value.__class__ not in leaves:
                push(value)
            continue
        if kind in functions:
            pending.extend(node.decorator_list)  # type: ignore[attr-defined]
            arguments: ast.arguments = node.args  # type: ignore[attr-defined]
            pending.extend(arguments.defaults)
            pending.extend(d for d in arguments.kw_defaults if d is not None)
            continue
        if kind is ast.Lambda:
            arguments = node.args  # type: ignore[attr-defined]
            pending.extend(arguments.defaults)
            pending.extend(d for d in arguments.kw_defaults if d is not None)
            continue
        fields = _CHILD_FIELDS.get(kind)
        if fields is None:
            fields = _child_fields(kind)
        for name in fields:
            child = getattr(node, name)
            if child.__class__ is list:
                for item in child:
                    if item is not None and item.__class__ not in leaves:
                        push(item)
            elif child is not None and child.__class__ not in leaves:
                push(child)
    return calls


def _function_reaches_define_job(
    resolver: Resolver, function: ProjectFunction, seen: set[tuple[str, str]]
) -> bool:
    key = (function.module.name, function.node.name)
    if key in seen or len(seen) > _MAX_WRAPPER_DEPTH:
        return False
    seen.add(key)
    for node in ast.walk(function.node):
        if not isinstance(node, ast.Call):
            continue
        callee = resolver.expr(node.func, function.module)
        if isinstance(callee, DefineJob):
            return True
        if isinstance(callee, ProjectFunction) and _function_reaches_define_job(
            resolver, callee, seen
        ):
            return True
    return False


def _wraps_define_job(resolver: Resolver, function: ProjectFunction) -> bool:
    """Whether calling ``function`` may reach ``define_job``; each function's body is
    walked once per run, however many job files call it."""
    key = (function.module.file, function.module.standalone, function.node.name)
    known = resolver.reaches_define_job.get(key)
    if known is None:
        known = _function_reaches_define_job(resolver, function, set())
        resolver.reaches_define_job[key] = known
    return known


def find_definition_calls(resolver: Resolver, module: ParsedModule) -> FoundCalls:
    """Classify every import-time call of ``module`` (which must have parsed)."""
    assert module.tree is not None
    found = FoundCalls()
    for call in import_time_calls(module.tree):
        callee = resolver.expr(call.func, module)
        if isinstance(callee, DefineJob):
            found.definitions.append(call)
        elif isinstance(callee, ProjectFunction):
            if _wraps_define_job(resolver, callee):
                where = resolver.index.relative(callee.module.file)
                found.wrappers.append(
                    f"line {call.lineno}: {source_of(call.func)}() defined in {where} wraps "
                    "define_job; the definition it makes is not resolved statically"
                )
        elif isinstance(callee, Unresolved) and callee.hidden:
            found.hidden.append(f"line {call.lineno}: {source_of(call.func)}: {callee.reason}")
    return found
