"""The job envelope: the one payload shape every platform job carries.

A fixed, validated shape lets any consumer, the dead-letter tooling and the replay
command treat a job the same way whatever its ``data`` model is, and lets a malformed
message be recognised as poison instead of crashing a handler.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, Generic, Self, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError, PydanticSerializationError

from platform_tasks.errors import EnvelopeError, SettingsError
from platform_tasks.keys import TENANT_PATTERN

DEFAULT_MAX_PAYLOAD_BYTES = 262_144
MAX_BYTES_CONTEXT = "max_bytes"
"""Key of the pydantic validation context that sets the size limit of one validation:
``Envelope[M].model_validate(payload, context={"max_bytes": 65_536})``."""
MAX_PAYLOAD_VARIABLE = "PLATFORM_MAX_PAYLOAD_BYTES"
NUL = "\x00"
_NUL_IN_JSON = b"\\u0000"
_UNFIT = "envelope_unfit"
KIND_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")

DataT = TypeVar("DataT")


class _MonotonicUuid7:
    """The last id this process made, so the next is greater (RFC 9562, 6.2, method 2).

    Ids made within one millisecond would otherwise sort by their random bits, and
    ``jobs list --correlation-id`` lists a request's jobs in publish order by their ids.
    In the same (or an earlier) millisecond the next id is the last one's random part
    plus one. A forked child (a prefork pool process) starts afresh, so it never counts
    on from its parent's last id and makes the same one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: tuple[int, int] = (-1, 0)
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._last = (-1, 0)

    def next(self, ms: int) -> uuid.UUID:
        with self._lock:
            last_ms, last_rand = self._last
            if ms > last_ms:
                rand = int.from_bytes(os.urandom(10), "big") & _RAND_MASK
            else:
                ms, rand = last_ms, last_rand + 1
                if rand > _RAND_MASK:  # 74 bits used up within one millisecond
                    ms, rand = ms + 1, int.from_bytes(os.urandom(10), "big") & _RAND_MASK
            self._last = (ms, rand)
        return _uuid7_of(ms, rand)


_RAND_MASK = (1 << 74) - 1
_monotonic_uuid7 = _MonotonicUuid7()


def uuid7(timestamp_ms: int | None = None) -> uuid.UUID:
    """A version 7 UUID: 48 bits of Unix milliseconds, then random bits (RFC 9562).

    Time-ordered ids keep the idempotency index and the dead-letter table append-mostly.
    Without ``timestamp_ms``, ids made by one process only grow, even within a
    millisecond; with it, the random bits are fresh.
    """
    if timestamp_ms is None:
        return _monotonic_uuid7.next(int(time.time() * 1000))
    return _uuid7_of(timestamp_ms, int.from_bytes(os.urandom(10), "big"))


_ID_PART_SEPARATOR = "\x1f"  # unit separator: cannot occur in job names, kinds or tenant ids


def derived_uuid7(timestamp_ms: int, *parts: str) -> uuid.UUID:
    """A version 7 UUID with ``timestamp_ms`` as its time and ``parts`` as its entropy.

    For ids that must come out the same every time (a fan-out's children, a handler's
    follow-up jobs): the 74 bits a UUIDv7 leaves to randomness are a SHA-256 of ``parts``.
    """
    digest = hashlib.sha256(_ID_PART_SEPARATOR.join(parts).encode()).digest()
    return _uuid7_of(timestamp_ms, int.from_bytes(digest[:10], "big"))


def _uuid7_of(ms: int, rand: int) -> uuid.UUID:
    """RFC 9562's layout: 48 bits of milliseconds, version 7, 74 bits of ``rand``."""
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return uuid.UUID(int=value)


_limit_cache: dict[str | None, int] = {}


def current_max_payload_bytes() -> int:
    """``PLATFORM_MAX_PAYLOAD_BYTES`` as it is now (validated like every setting).

    Read on each call, parsed once per distinct value, so the limit an envelope is held
    to is the one the process is configured with, without building settings per message.
    """
    raw = os.environ.get(MAX_PAYLOAD_VARIABLE)
    limit = _limit_cache.get(raw)
    if limit is None:
        if raw is None:
            limit = DEFAULT_MAX_PAYLOAD_BYTES
        else:
            from platform_tasks.settings import PlatformSettings

            limit = PlatformSettings.build(max_payload_bytes=raw).max_payload_bytes
        _limit_cache[raw] = limit
    return limit


def _limit_of(context: Any) -> int:
    if isinstance(context, dict):
        limit = context.get(MAX_BYTES_CONTEXT)
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise SettingsError([(MAX_BYTES_CONTEXT, f"must be a positive int, got {limit!r}")])
            return limit
    return current_max_payload_bytes()


def _shown(key: str) -> str:
    return key.replace(NUL, "\\u0000")


def nul_paths(value: Any, path: str = "") -> Iterator[str]:
    """Dotted paths of every string (or mapping key) under ``value`` holding a NUL character.

    PostgreSQL can store NUL neither in ``text`` nor in ``jsonb``, so an envelope holding
    one could never become a dead letter as it is.
    """
    if isinstance(value, str):
        if NUL in value:
            yield path or "<envelope>"
    elif isinstance(value, dict):
        for key, item in value.items():
            name = _shown(str(key))
            where = f"{path}.{name}" if path else name
            if isinstance(key, str) and NUL in key:
                yield f"{where} (key)"
            yield from nul_paths(item, where)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from nul_paths(item, f"{path}.{index}" if path else str(index))


def _nul_problem(path: str) -> tuple[str, str]:
    return (path, "contains a NUL character (\\u0000), which PostgreSQL cannot store")


def _oversize(size: int, max_bytes: int) -> tuple[str, str]:
    return ("<envelope>", f"serialized size {size} bytes exceeds {max_bytes}")


def _unfit(problems: list[tuple[str, str]]) -> PydanticCustomError:
    message = "; ".join(f"{field}: {msg}" for field, msg in problems)
    return PydanticCustomError(_UNFIT, "{message}", {"message": message, "problems": problems})


class Envelope(BaseModel, Generic[DataT]):
    """``{job_id, tenant_id, correlation_id, kind, data}``; ``Envelope[MyData]`` types ``data``.

    Unknown fields are rejected so a producer's typo is an error, not silently dropped data.
    The model itself holds the envelope to what can cross the broker and be stored: its
    compact JSON at most the size limit (``PLATFORM_MAX_PAYLOAD_BYTES``, or the
    ``max_bytes`` of the validation context), and no NUL character in any string.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: uuid.UUID
    tenant_id: str = Field(pattern=TENANT_PATTERN)
    correlation_id: str = Field(min_length=1, max_length=128)
    kind: str = Field(max_length=255)
    data: DataT

    @field_validator("job_id")
    @classmethod
    def _uuid_version_7(cls, value: uuid.UUID) -> uuid.UUID:
        # what ``value.version == 7`` says (the RFC variant, then the version bits), read
        # from the integer once instead of through two properties on every message
        bits = value.int
        if (bits >> 62) & 0b11 != 0b10 or (bits >> 76) & 0xF != 7:
            raise ValueError(f"must be a UUID of version 7, got version {value.version}")
        return value

    @field_validator("kind")
    @classmethod
    def _dotted_name(cls, value: str) -> str:
        if not KIND_PATTERN.match(value):
            raise ValueError(
                "must be at least two dot-separated identifiers, e.g. 'billing.charge_invoice'"
            )
        return value

    @model_validator(mode="after")
    def _fits_broker_and_database(self, info: ValidationInfo) -> Self:
        limit = _limit_of(info.context)
        try:
            raw = type(self).__pydantic_serializer__.to_json(self)
        except PydanticSerializationError as exc:
            raise _unfit([("<envelope>", f"is not JSON-serializable: {exc}")]) from None
        if len(raw) <= limit and _NUL_IN_JSON not in raw:
            return self
        problems: list[tuple[str, str]] = []
        if len(raw) > limit:
            problems.append(_oversize(len(raw), limit))
        if _NUL_IN_JSON in raw:  # the fast test; the walk names the fields
            problems.extend(_nul_problem(path) for path in nul_paths(json.loads(raw)))
        if problems:
            raise _unfit(problems)
        return self

    def to_message(self) -> dict[str, Any]:
        """The JSON-safe dict that crosses the broker."""
        return self.model_dump(mode="json")

    def redacted(self) -> str:
        """What logs and Flower may show: identifiers, never ``data``."""
        return (
            f"job_id={self.job_id} tenant={self.tenant_id} kind={self.kind} "
            f"correlation_id={self.correlation_id}"
        )


def validation_errors(exc: ValidationError) -> list[tuple[str, str]]:
    """Every bad field of a pydantic error as ``(dotted.path, message)``."""
    problems: list[tuple[str, str]] = []
    for error in exc.errors():
        if error.get("type") == _UNFIT:
            problems.extend(error["ctx"]["problems"])
            continue
        loc = ".".join(str(part) for part in error.get("loc", ())) or "<envelope>"
        problems.append((loc, error.get("msg", "invalid")))
    return problems


def serialized_size(message: dict[str, Any]) -> int:
    """Size in bytes of the JSON that will cross the broker."""
    return len(json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode())


_MODELS: dict[type[Any], type[Envelope[Any]]] = {}


def envelope_model(data_model: type[Any]) -> type[Envelope[Any]]:
    """``Envelope[data_model]``, built once per data model (publish and consume are hot)."""
    model = _MODELS.get(data_model)
    if model is None:
        model = _MODELS[data_model] = Envelope[data_model]  # type: ignore[valid-type]
    return model


def parse_envelope(
    payload: Any,
    data_model: type[Any] = dict,
    *,
    max_bytes: int | None = None,
) -> Envelope[Any]:
    """Validate ``payload`` as ``Envelope[data_model]``; raise :class:`EnvelopeError`.

    The rules are the model's own (so ``publish``, consume and replay apply one rule);
    ``max_bytes`` overrides the size limit for this call, default the current setting.
    When a field is invalid the model's whole-envelope checks do not run, so the size
    (measured by the standard library) and any NUL character are reported here, beside
    the field errors, and one error lists every problem.
    """
    if not isinstance(payload, dict):
        raise EnvelopeError([("<envelope>", f"must be an object, got {type(payload).__name__}")])
    model = envelope_model(data_model)
    limit = max_bytes if max_bytes is not None else current_max_payload_bytes()
    try:
        return model.model_validate(payload, context={MAX_BYTES_CONTEXT: limit})
    except ValidationError as exc:
        problems = validation_errors(exc)
        if any(error.get("type") == _UNFIT for error in exc.errors()):
            raise EnvelopeError(problems) from None
        try:
            size = serialized_size(payload)
        except (TypeError, ValueError) as json_exc:
            problems.insert(0, ("<envelope>", f"is not JSON-serializable: {json_exc}"))
        else:
            if size > limit:
                problems.insert(0, _oversize(size, limit))
        named = {field for field, _ in problems}
        problems.extend(_nul_problem(path) for path in nul_paths(payload) if path not in named)
        raise EnvelopeError(problems) from None
