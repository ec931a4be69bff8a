"""A dead letter's payload as the console shows it: the customer's data only with the
permission, and stored text always escaped."""

from __future__ import annotations

from platform_tasks.contrib.django.payloads import (
    HIDDEN,
    OTHER_KEYS,
    error_html,
    payload_html,
    visible_payload,
)

ENVELOPE = {"job_id": "j", "tenant_id": "acme", "kind": "k", "data": {"card": "4111"}}


def test_data_is_hidden_without_the_permission_and_the_rest_is_kept() -> None:
    assert visible_payload(ENVELOPE, show_data=False) == {**ENVELOPE, "data": HIDDEN}
    assert visible_payload(ENVELOPE, show_data=True) == ENVELOPE


def test_a_raw_poison_message_shows_its_encoding_and_content_type_only() -> None:
    poison = {
        "raw": "secret body",
        "raw_encoding": "text",
        "content_type": "application/json",
        "headers": {"x-customer": "alice@example.com"},
    }
    assert visible_payload(poison, show_data=False) == {
        "raw": HIDDEN,
        "raw_encoding": "text",
        "content_type": "application/json",
        "headers": HIDDEN,
    }
    assert visible_payload(["a", "list"], show_data=False) == HIDDEN


def test_payloads_that_are_not_envelopes_show_no_value_and_no_unknown_key() -> None:
    celery = {"args": ["bob@example.com"], "kwargs": {"plan": "pro"}}
    assert visible_payload(celery, show_data=False) == {"args": HIDDEN, "kwargs": HIDDEN}
    foreign = {"kind": "crm.sync", "alice@example.com": 1, "customer": {"email": "c@d.e"}}
    shown = visible_payload(foreign, show_data=False)
    assert shown == {"kind": "crm.sync", OTHER_KEYS: f"2 more keys {HIDDEN}"}
    # a metadata key holding a structure is not metadata
    assert visible_payload({"tenant_id": {"email": "c@d.e"}}, show_data=False) == {
        "tenant_id": HIDDEN
    }
    assert visible_payload(foreign, show_data=True) == foreign


def test_the_error_text_needs_the_permission_and_is_escaped() -> None:
    text = "IntegrityError\nDETAIL:  Key (email)=(<b>alice@example.com</b>) exists."
    hidden = error_html(text, show_error=False)
    assert "alice" not in hidden and HIDDEN in hidden
    shown = error_html(text, show_error=True)
    assert "&lt;b&gt;alice@example.com&lt;/b&gt;" in shown and "<b>" not in shown


def test_stored_markup_is_escaped() -> None:
    html = payload_html({"data": "<script>alert(1)</script>"}, show_data=True)
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert html.startswith('<pre class="platform-payload">')
