"""Turning the keywords of one ``define_job`` call into per-field evidence.

Every field ends in exactly one state. A literal (or a constant resolved inside the
roots) is *known*; a keyword that is not written is *absent* and shows the documented
default; anything else is *unknown* with the reason, even when a plausible value is
in sight (for ``name``, the path label is never substituted for an unknown value).
"""

from __future__ import annotations

import ast
from datetime import timedelta

from platform_tasks.jobdocs.defaults import (
    ACCEPTED_KEYWORDS,
    DEFAULT_ENABLED,
    DEFAULT_QUEUE,
    DEFAULT_TIMEZONE,
    FIELDS_DEFAULTING_ON_NONE,
    default_lease_ttl,
)
from platform_tasks.jobdocs.evidence import FIELD_NAMES, FieldEvidence, FieldState, JsonValue
from platform_tasks.jobdocs.resolve import LiteralValue, Resolver, Unresolved, Value, source_of
from platform_tasks.jobdocs.sources import ParsedModule

__all__ = ["CallFields", "read_call_fields", "to_json_value"]


class CallFields:
    """The outcome of reading one call: evidence, raw known values and what went wrong.
    (A plain class, made once per definition; see ``FoundCalls``.)"""

    __slots__ = ("call_errors", "evidence", "gaps", "known")

    def __init__(self, call_errors: list[str]) -> None:
        self.evidence: dict[str, FieldEvidence] = {}
        self.known: dict[str, LiteralValue] = {}
        self.gaps: list[str] = []
        self.call_errors = call_errors


def to_json_value(value: LiteralValue) -> JsonValue:
    """Durations become seconds so the JSON needs no custom types."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
        return int(seconds) if seconds.is_integer() else seconds
    return value


_ABSENT_WITHOUT_VALUE: dict[str, LiteralValue] = {
    "timezone": DEFAULT_TIMEZONE,
    "enabled": DEFAULT_ENABLED,
    "queue": DEFAULT_QUEUE,
    "cron": None,
    "interval": None,
}
"""Absent fields whose default does not depend on the rest of the call."""


def read_call_fields(
    resolver: Resolver, module: ParsedModule, call: ast.Call, path_label: str
) -> CallFields:
    """Evidence for every documented field of ``call``."""
    given: dict[str, ast.expr] = {}
    splats: list[str] = []
    errors: list[str] = []
    if call.args:
        errors.append("define_job takes keyword arguments only; positional arguments given")
    for keyword in call.keywords:
        if keyword.arg is None:
            splats.append(source_of(keyword.value))
        elif keyword.arg not in ACCEPTED_KEYWORDS:
            errors.append(f"unexpected keyword argument {keyword.arg!r}")
        else:
            given[keyword.arg] = keyword.value
    if "handler" not in given and not splats:
        errors.append("handler is required")

    result = CallFields(errors)
    known, gaps, found = result.known, result.gaps, result.evidence
    # One pass in field order: ``interval`` comes before ``lease_ttl``, whose absent
    # default follows the known interval.
    for name in FIELD_NAMES:
        node = given.get(name)
        if node is None:
            if splats:
                found[name] = _UNKNOWN
                gaps.append(f"{name}: may be set by **{splats[0]}, not resolved statically")
            else:
                found[name] = _absent(name, path_label, known)
            continue
        resolved = resolver.expr(node, module)
        if resolved.__class__ is Value:
            value = resolved.value
            if value is None and name in FIELDS_DEFAULTING_ON_NONE:
                found[name] = _absent(name, path_label, known)
            else:
                known[name] = value
                found[name] = _evidence(FieldState.KNOWN, to_json_value(value))
        else:
            found[name] = _UNKNOWN
            reason = (
                resolved.reason
                if isinstance(resolved, Unresolved)
                else f"{source_of(node)} is not a literal value"
            )
            gaps.append(f"{name}: {reason}")
    return result


def _absent(name: str, path_label: str, known: dict[str, LiteralValue]) -> FieldEvidence:
    """The evidence of a field not given: its documented default."""
    evidence = _ABSENT_EVIDENCE.get(name)
    if evidence is not None:
        return evidence
    if name == "name":  # each label is seen once: not worth sharing
        return FieldEvidence(FieldState.ABSENT, path_label)
    # lease_ttl, the one default that depends on the call: the known interval, capped
    interval = known.get("interval")
    default = default_lease_ttl(interval if isinstance(interval, timedelta) else None)
    return _evidence(FieldState.ABSENT, to_json_value(default))


_SHARED: dict[tuple[FieldState, type, JsonValue], FieldEvidence] = {}


def _evidence(state: FieldState, value: JsonValue) -> FieldEvidence:
    """A shared :class:`FieldEvidence` (immutable): thousands of definitions repeat the
    same few states and defaults. The type is part of the key, as ``True == 1``; floats
    are not shared (``0.0 == -0.0``, and NaN equals nothing)."""
    if isinstance(value, float):
        return FieldEvidence(state, value)
    key = (state, type(value), value)
    found = _SHARED.get(key)
    if found is None:
        if len(_SHARED) >= 4096:
            _SHARED.clear()
        found = _SHARED[key] = FieldEvidence(state, value)
    return found


_UNKNOWN = FieldEvidence(FieldState.UNKNOWN, None)
_ABSENT_EVIDENCE = {
    name: FieldEvidence(FieldState.ABSENT, to_json_value(value))
    for name, value in _ABSENT_WITHOUT_VALUE.items()
}
"""Absent fields whose evidence is the same in every call."""
