"""Hypothesis strategies more than one test module draws from.

Built from alphabets rather than ``st.from_regex``: a regex strategy's first draw builds
it, which took about a second under a slow (traced) interpreter, and Hypothesis counts
that time against the test.
"""

from __future__ import annotations

import string

from hypothesis import strategies as st

TENANT_CHARACTERS = string.ascii_letters + string.digits + "_.:-"
"""The characters of ``TENANT_PATTERN`` in :mod:`platform_tasks.envelope`."""

tenant_ids = st.text(alphabet=TENANT_CHARACTERS, min_size=1, max_size=128)
"""Every valid ``tenant_id``: 1 to 128 of those characters."""
