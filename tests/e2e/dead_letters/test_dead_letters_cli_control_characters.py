"""Terminal control sequences stored in a dead letter never reach the operator's terminal.

A dead letter's tenant, kind, queue, error and payload are producer data. The real console
script prints them (``list``, ``show``, their ``--json`` forms, ``discard``'s report) and
the output is read as raw bytes: no ESC byte, and once decoded no C0 control but newline
and tab, no DEL and no C1 control (``\\x9b`` is a one-character CSI); the visible text
around the sequences is still there.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.e2e.dead_letters.test_dead_letters_cli import CLI, REPO_ROOT, Env, envelope

TITLE = "\x1b]0;pwned\x07"  # OSC: set the terminal's title
CLEAR = "\x1b[2J"  # CSI: clear the screen
C1_CSI = "\x9b31m"  # the one-byte CSI of C1


@pytest.fixture
def cli(redis_url: str, database_url: str) -> Env:
    return Env(redis_url, database_url)


def run_bytes(cli: Env, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [CLI, "dead-letters", *args],
        cwd=REPO_ROOT,
        env=cli.env,
        capture_output=True,
        timeout=60,
    )


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""C0 controls but tab and newline, DEL, C1 controls (as characters of the UTF-8 output)."""


def assert_no_control(output: bytes) -> None:
    assert b"\x1b" not in output
    text = output.decode()
    assert CONTROL.findall(text) == []


def test_list_and_show_strip_escape_sequences_from_stored_rows(cli: Env) -> None:
    payload = envelope(kind=f"shop{TITLE}.charge", tenant=f"acme{CLEAR}")
    payload["data"] = {"note": f"see {TITLE}{CLEAR}{C1_CSI}here"}
    row_id = cli.add(
        payload,
        queue=f"default{CLEAR}",
        kind=payload["kind"],
        tenant_id=payload["tenant_id"],
        error_type=f"Runtime{C1_CSI}Error",
        last_error=f"RuntimeError: {TITLE}boom{CLEAR}\nline two\tend",
    )
    outputs = {
        "list": run_bytes(cli, "list"),
        "list --json": run_bytes(cli, "list", "--json"),
        "show": run_bytes(cli, "show", str(row_id)),
        "show --json": run_bytes(cli, "show", str(row_id), "--json"),
    }
    for name, result in outputs.items():
        assert result.returncode == 0, (name, result.stderr)
        assert_no_control(result.stdout + result.stderr)
    listed = outputs["list"].stdout.decode()
    assert "acme" in listed and "shop" in listed and ".charge" in listed
    shown = outputs["show"].stdout.decode()
    assert "boom" in shown and "line two" in shown  # the error's newline is kept
    assert "here" in shown
    discarded = run_bytes(cli, "discard", str(row_id), "--reason", f"bad {TITLE}row")
    assert discarded.returncode == 0, discarded.stderr
    assert_no_control(discarded.stdout + discarded.stderr)
