"""What connections this test process has open, read from the kernel (``psutil``)."""

from __future__ import annotations

import os

import psutil


def established_to(port: int) -> set[int]:
    """Local ports of this process's established TCP connections to ``port`` on any host.

    The client ends only: a server in this process (a loopback provider) has ``port`` as
    its local port, not its remote one.
    """
    return {
        conn.laddr.port
        for conn in psutil.net_connections(kind="tcp")
        if conn.pid == os.getpid()
        and conn.raddr
        and conn.raddr.port == port
        and conn.status == psutil.CONN_ESTABLISHED
    }
