"""Which calls a module makes at import time, and in which order.

The reader's walk is tuned (per-type tables, nodes that hold no call never queued), so
it is compared with the plain definition: breadth-first over ``ast.iter_child_nodes``,
not entering function or lambda bodies but visiting decorators and default values.
The order matters: it is the order of a file's definitions and of its reasons.
"""

from __future__ import annotations

import ast
import sysconfig
from collections import deque
from pathlib import Path

import pytest

from platform_tasks.jobdocs.definitions import import_time_calls

TRICKY = """
import os
from pkg import define_job as dj, helper

@decorate(arg=make())
def handler(ctx, retries=default_retries(), *, limit=limit_of(env("X"))):
    inner_call_never_counted()

class Config(Base, metaclass=meta_of(), flag=flag_of()):
    value = compute(1, key=nested(deep()))
    def method(self, x=method_default()):
        not_counted()

callback = lambda x=lambda_default(): not_counted(x)
values = [make_item(i) for i in items() if keep(i)]
table = {key(k): value(v) for k, v in pairs()}
if feature(flag()):
    dj(handler=handler, cron=cron_of(zone()), **extra(kw()))
else:
    helper(*args_of(), name=name_of())
try:
    risky()
except error_type() as exc:
    recover(exc)
with opened(path()) as f, other():
    consume(f)
for item in iterate(source()):
    per_item(item)
match subject():
    case Point(x=0) if guard():
        matched()
    case _:
        fallback()
result = first() if test() else second()
total = a() + b() * c(-d())
"""


def _reference(tree: ast.Module) -> list[ast.Call]:
    calls: list[ast.Call] = []
    pending: deque[ast.AST] = deque(tree.body)
    while pending:
        node = pending.popleft()
        if isinstance(node, ast.Call):
            calls.append(node)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            if not isinstance(node, ast.Lambda):
                pending.extend(node.decorator_list)
            pending.extend(node.args.defaults)
            pending.extend(d for d in node.args.kw_defaults if d is not None)
            continue
        pending.extend(ast.iter_child_nodes(node))
    return calls


def _names(calls: list[ast.Call]) -> list[str]:
    return [ast.unparse(call.func) for call in calls]


def test_tricky_module_in_breadth_first_order() -> None:
    tree = ast.parse(TRICKY)

    found = import_time_calls(tree)

    assert found == _reference(tree)
    names = _names(found)
    # function and lambda bodies, and methods' bodies, are never entered
    assert not {"inner_call_never_counted", "not_counted"} & set(names)
    # decorators and defaults, class keywords, guards and nested keyword values are
    assert {
        "decorate",
        "make",
        "default_retries",
        "limit_of",
        "env",
        "meta_of",
        "flag_of",
        "method_default",
        "lambda_default",
        "guard",
        "deep",
        "kw",
    } <= set(names)
    # breadth-first: a statement's own call comes before calls nested inside it
    assert names.index("feature") < names.index("flag") < names.index("dj")
    assert names.index("dj") < names.index("cron_of") < names.index("zone")


def _stdlib_sample() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(root.glob("*.py"))


@pytest.mark.parametrize("chunk", range(4))
def test_same_calls_in_the_same_order_as_the_plain_walk_on_the_standard_library(
    chunk: int,
) -> None:
    files = _stdlib_sample()[chunk::4]
    assert len(files) > 40
    for path in files:
        tree = ast.parse(path.read_bytes(), filename=str(path))
        assert import_time_calls(tree) == _reference(tree), path
