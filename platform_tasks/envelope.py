"""The job envelope: the one payload shape every platform job carries.

A fixed, validated shape lets any consumer, the dead-letter tooling and the replay
command treat a job the same way whatever its ``data`` model is, and lets a malformed
message be recognised as poison instead of crashing a handler.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticSerializationError

from platform_tasks.errors import EnvelopeError

DEFAULT_MAX_PAYLOAD_BYTES = 262_144
TENANT_PATTERN = r"^[A-Za-z0-9_.:\-]{1,128}$"
KIND_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")

DataT = TypeVar("DataT")


def uuid7(timestamp_ms: int | None = None) -> uuid.UUID:
    """A version 7 UUID: 48 bits of Unix milliseconds, then random bits (RFC 9562).

    Time-ordered ids keep the idempotency index and the dead-letter table append-mostly.
    """
    ms = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return uuid.UUID(int=value)


class Envelope(BaseModel, Generic[DataT]):
    """``{job_id, tenant_id, correlation_id, kind, data}``; ``Envelope[MyData]`` types ``data``.

    Unknown fields are rejected so a producer's typo is an error, not silently dropped data.
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
        if value.version != 7:
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
    problems = []
    for error in exc.errors():
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


def _oversize(size: int, max_bytes: int) -> tuple[str, str]:
    return ("<envelope>", f"serialized size {size} bytes exceeds {max_bytes}")


def parse_envelope(
    payload: Any,
    data_model: type[Any] = dict,
    *,
    max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> Envelope[Any]:
    """Validate ``payload`` as ``Envelope[data_model]``; raise :class:`EnvelopeError`.

    The size check and field checks report together, so one error lists every problem.
    A valid envelope is measured by pydantic's own JSON encoder (the compact UTF-8 JSON
    that crosses the broker); an invalid one by the standard library, to report its size
    alongside the field errors.
    """
    if not isinstance(payload, dict):
        raise EnvelopeError([("<envelope>", f"must be an object, got {type(payload).__name__}")])
    model = envelope_model(data_model)
    try:
        envelope = model.model_validate(payload)
    except ValidationError as exc:
        problems = validation_errors(exc)
        try:
            size = serialized_size(payload)
        except (TypeError, ValueError) as json_exc:
            problems.insert(0, ("<envelope>", f"is not JSON-serializable: {json_exc}"))
        else:
            if size > max_bytes:
                problems.insert(0, _oversize(size, max_bytes))
        raise EnvelopeError(problems) from None
    try:
        size = len(model.__pydantic_serializer__.to_json(envelope))
    except PydanticSerializationError as exc:
        raise EnvelopeError([("<envelope>", f"is not JSON-serializable: {exc}")]) from None
    if size > max_bytes:
        raise EnvelopeError([_oversize(size, max_bytes)])
    return envelope
