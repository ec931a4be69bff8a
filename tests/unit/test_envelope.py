"""Envelope validation: the table of bad inputs, and round trips of good ones."""

from __future__ import annotations

import json
import operator
import os
import string
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from platform_tasks import envelope as envelope_module
from platform_tasks.envelope import Envelope, parse_envelope, uuid7
from platform_tasks.errors import EnvelopeError, SettingsError
from tests.support.strategies import tenant_ids


class Charge(BaseModel):
    invoice_id: int
    amount_cents: int


def valid(**overrides: object) -> dict[str, object]:
    payload: dict[str, object] = {
        "job_id": str(uuid7()),
        "tenant_id": "acme-01",
        "correlation_id": "req-123",
        "kind": "billing.charge_invoice",
        "data": {"invoice_id": 7, "amount_cents": 1200},
    }
    payload.update(overrides)
    return payload


def test_uuid7_has_version_7_and_is_time_ordered() -> None:
    first, second = uuid7(1_700_000_000_000), uuid7(1_700_000_000_001)
    assert first.version == 7 and second.version == 7
    assert first.variant == uuid.RFC_4122
    assert first < second
    assert int(first.hex[:12], 16) == 1_700_000_000_000


def test_valid_payload_is_typed_by_data_model() -> None:
    envelope = parse_envelope(valid(), Charge)
    assert isinstance(envelope.data, Charge)
    assert envelope.data.amount_cents == 1200
    assert envelope.kind == "billing.charge_invoice"


@pytest.mark.parametrize(
    ("overrides", "field", "fragment"),
    [
        ({"job_id": str(uuid.uuid4())}, "job_id", "version 7"),
        ({"job_id": "not-a-uuid"}, "job_id", "UUID"),
        ({"tenant_id": ""}, "tenant_id", "pattern"),
        ({"tenant_id": "x" * 129}, "tenant_id", "pattern"),
        ({"tenant_id": "acme/../etc"}, "tenant_id", "pattern"),
        ({"correlation_id": ""}, "correlation_id", "at least 1"),
        ({"correlation_id": "c" * 129}, "correlation_id", "at most 128"),
        ({"kind": "charge"}, "kind", "dot-separated"),
        ({"kind": "billing..charge"}, "kind", "dot-separated"),
        ({"kind": "billing.1charge"}, "kind", "dot-separated"),
        ({"surprise": 1}, "surprise", "Extra inputs"),
        ({"data": {"invoice_id": "x", "amount_cents": 1}}, "data.invoice_id", "integer"),
    ],
)
def test_each_bad_field_is_named(overrides: dict[str, object], field: str, fragment: str) -> None:
    with pytest.raises(EnvelopeError) as info:
        parse_envelope(valid(**overrides), Charge)
    fields = dict(info.value.errors)
    assert field in fields, info.value.errors
    assert fragment in fields[field]


def test_missing_fields_are_all_listed_at_once() -> None:
    with pytest.raises(EnvelopeError) as info:
        parse_envelope({"data": {}}, dict)
    named = {field for field, _ in info.value.errors}
    assert {"job_id", "tenant_id", "correlation_id", "kind"} <= named


def test_oversized_payload_is_refused_with_its_size() -> None:
    payload = valid(data={"blob": "x" * 2000})
    with pytest.raises(EnvelopeError) as info:
        parse_envelope(payload, dict, max_bytes=1024)
    assert "exceeds 1024" in str(info.value)


def test_non_object_payload() -> None:
    with pytest.raises(EnvelopeError, match="must be an object"):
        parse_envelope(["not", "a", "dict"], dict)


def test_redacted_form_never_shows_data() -> None:
    envelope = parse_envelope(valid(data={"invoice_id": 1, "amount_cents": 999_999}), Charge)
    text = envelope.redacted()
    assert "999999" not in text
    assert str(envelope.job_id) in text and "acme-01" in text


# NUL is refused by design (see the NUL tests below), so generated text leaves it out.
texts = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)
# from alphabets, like tenant_ids (see tests/support/strategies.py)
identifiers = st.builds(
    operator.add,
    st.sampled_from(string.ascii_letters + "_"),
    st.text(alphabet=string.ascii_letters + string.digits + "_", max_size=10),
)
kinds = st.lists(identifiers, min_size=2, max_size=4).map(".".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | texts,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(texts, children, max_size=3),
    max_leaves=10,
)


@given(
    tenant=tenant_ids,
    correlation=st.text(
        alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=128
    ),
    kind=kinds,
    data=st.dictionaries(texts, json_values, max_size=5),
)
def test_round_trip_through_json(tenant: str, correlation: str, kind: str, data: dict) -> None:
    envelope = parse_envelope(
        valid(tenant_id=tenant, correlation_id=correlation, kind=kind, data=data), dict
    )
    wire = json.loads(json.dumps(envelope.to_message()))
    again = parse_envelope(wire, dict)
    assert again == envelope
    assert Envelope[dict].model_validate(wire).tenant_id == tenant  # type: ignore[type-arg]


def test_data_that_cannot_cross_the_broker_is_refused() -> None:
    with pytest.raises(EnvelopeError, match="not JSON-serializable"):
        parse_envelope(valid(data={"handle": object()}), dict)


def test_size_is_reported_with_field_errors() -> None:
    with pytest.raises(EnvelopeError) as info:
        parse_envelope(valid(tenant_id="", data={"blob": "x" * 2000}), dict, max_bytes=1024)
    fields = [field for field, _ in info.value.errors]
    assert fields == ["<envelope>", "tenant_id"]


def test_the_model_itself_enforces_the_size_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not only ``parse_envelope``: ``Envelope[M].model_validate`` and the constructor too."""
    big = valid(data={"blob": "x" * (300 * 1024)})
    with pytest.raises(ValidationError, match="exceeds 262144"):
        Envelope[dict].model_validate(big)  # type: ignore[type-arg]
    with pytest.raises(ValidationError, match="exceeds 262144"):
        Envelope[dict](**big)  # type: ignore[type-arg, arg-type]
    # the caller's explicit limit, through the validation context
    small = valid(data={"blob": "x" * 2000})
    with pytest.raises(ValidationError, match="exceeds 1024"):
        Envelope[dict].model_validate(small, context={"max_bytes": 1024})  # type: ignore[type-arg]
    assert Envelope[dict].model_validate(big, context={"max_bytes": 400 * 1024})  # type: ignore[type-arg]
    # the current setting
    monkeypatch.setenv("PLATFORM_MAX_PAYLOAD_BYTES", "2048")
    with pytest.raises(EnvelopeError, match="exceeds 2048"):
        parse_envelope(valid(data={"blob": "x" * 3000}), dict)
    monkeypatch.setenv("PLATFORM_MAX_PAYLOAD_BYTES", "lots")
    with pytest.raises(SettingsError, match="PLATFORM_MAX_PAYLOAD_BYTES"):
        parse_envelope(valid(), dict)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"correlation_id": "req\x00-1"}, "correlation_id"),
        ({"data": {"note": "a\x00b"}}, "data.note"),
        ({"data": {"items": [{"name": "ok"}, {"name": "\x00"}]}}, "data.items.1.name"),
        ({"data": {"k\x00": 1}}, "data.k\\u0000 (key)"),
        ({"tenant_id": "acme\x00"}, "tenant_id"),
        ({"kind": "billing.charge\x00"}, "kind"),
    ],
)
def test_nul_characters_are_refused_naming_the_field(
    overrides: dict[str, object], field: str
) -> None:
    with pytest.raises(EnvelopeError) as info:
        parse_envelope(valid(**overrides), dict)
    assert field in dict(info.value.errors), info.value.errors
    with pytest.raises(ValidationError):
        Envelope[dict].model_validate(valid(**overrides))  # type: ignore[type-arg]


def test_nul_is_reported_beside_other_field_errors() -> None:
    with pytest.raises(EnvelopeError) as info:
        parse_envelope(valid(tenant_id="", data={"deep": {"x": ["\x00"]}}), dict)
    fields = dict(info.value.errors)
    assert "tenant_id" in fields
    assert "NUL" in fields["data.deep.x.0"]


def test_the_text_backslash_u0000_is_not_a_nul() -> None:
    envelope = parse_envelope(valid(data={"note": "\\u0000 is how JSON spells NUL"}), dict)
    assert envelope.data["note"].startswith("\\u0000")


def test_uuid7_ids_of_one_process_only_grow_within_a_millisecond() -> None:
    """Thousands of ids a millisecond: sorted by id they stay in the order they were made
    (``jobs list --correlation-id`` lists a request's jobs in publish order by id)."""
    ids = [uuid7() for _ in range(20_000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert {(i.version, i.variant) for i in ids} == {(7, uuid.RFC_4122)}
    assert len({i.int >> 80 for i in ids}) < len(ids), "several ids share a millisecond"


def test_uuid7_in_a_forked_child_does_not_count_on_from_the_parent() -> None:
    """A prefork pool process starts afresh: counting on from its parent's last id, a
    child and its parent would make the same id in the same millisecond."""
    uuid7()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.write(write, repr(envelope_module._monotonic_uuid7._last).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 100).decode() == repr((-1, 0))
    os.close(read)
