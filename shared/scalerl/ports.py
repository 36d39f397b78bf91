"""Ports for processes started later: chosen below the kernel's ephemeral range.

A port found by binding port 0 comes from the ephemeral range, the same range the kernel draws the local port of
every outgoing connection from. Between choosing such a port and the process binding it, any connection (a gRPC
channel, a Redis client, gloo's mesh between learner ranks) may take it, and a long-lived one holds it through
every restart of the process that wanted it. Below the range only an explicit bind can take a port."""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 20000
"""The lowest port handed out: above the well-known and most registered services' ports."""
_handed_out: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ephemeral ports (Linux: /proc; elsewhere the IANA range, macOS's default)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49152, 65535


def bindable(port: int, host: str = "127.0.0.1", *, reuse_addr: bool = False) -> bool:
    """Whether a socket can bind host:port now. reuse_addr as servers set it: a closed connection's TIME_WAIT then
    does not count, a listener or another open socket on the port still does."""
    with socket.socket() as s:
        if reuse_addr:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def unused_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, outside the ephemeral range, and not handed out before by this process."""
    low, high = ephemeral_range()
    candidates = [p for p in (*range(LOWEST, low), *range(high + 1, 65536)) if p not in _handed_out]
    if not candidates and low <= LOWEST and high >= 65535:  # the kernel hands out every port: best effort
        with socket.socket() as s:
            s.bind((host, 0))
            return s.getsockname()[1]
    random.SystemRandom().shuffle(candidates)
    for port in candidates[:1000]:
        if bindable(port, host):
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no unused port outside the ephemeral range {low}-{high} on {host}")
