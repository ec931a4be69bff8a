"""A dead letter's payload as the console shows it: the customer's data only with the
permission, and stored text always escaped."""

from __future__ import annotations

from platform_tasks.contrib.django.payloads import HIDDEN, payload_html, visible_payload

ENVELOPE = {"job_id": "j", "tenant_id": "acme", "kind": "k", "data": {"card": "4111"}}


def test_data_is_hidden_without_the_permission_and_the_rest_is_kept() -> None:
    assert visible_payload(ENVELOPE, show_data=False) == {**ENVELOPE, "data": HIDDEN}
    assert visible_payload(ENVELOPE, show_data=True) == ENVELOPE


def test_a_raw_poison_message_and_a_non_object_are_hidden() -> None:
    assert visible_payload({"raw": "secret body"}, show_data=False) == {"raw": HIDDEN}
    assert visible_payload(["a", "list"], show_data=False) == HIDDEN


def test_stored_markup_is_escaped() -> None:
    html = payload_html({"data": "<script>alert(1)</script>"}, show_data=True)
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert html.startswith('<pre class="platform-payload">')
