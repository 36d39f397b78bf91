"""Ports chosen for processes started later stay out of the range the kernel takes outgoing connections' ports from."""

from __future__ import annotations

import contextlib
import socket

import pytest

from scalerl import ports
from scalerl.ports import ephemeral_range, unused_port


def test_ports_lie_outside_the_kernels_ephemeral_range_and_are_free():
    low, high = ephemeral_range()
    chosen = [unused_port() for _ in range(40)]
    assert len(set(chosen)) == len(chosen)
    assert all(p < low or p > high for p in chosen), [p for p in chosen if low <= p <= high]
    for port in chosen:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def _free_run_of_ports(n: int) -> int:
    for base in range(ports.LOWEST, ports.LOWEST + 5000):
        try:
            with contextlib.ExitStack() as held:
                for port in range(base, base + n):
                    held.enter_context(socket.create_server(("127.0.0.1", port)))
            return base
        except OSError:
            continue
    raise AssertionError("no run of free ports to test with")


def test_a_port_someone_listens_on_is_skipped_and_none_left_is_an_error(monkeypatch):
    base = _free_run_of_ports(3)
    monkeypatch.setattr(ports, "LOWEST", base)
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (base + 3, 65535))
    monkeypatch.setattr(ports, "_handed_out", set())
    with socket.create_server(("127.0.0.1", base)), socket.create_server(("127.0.0.1", base + 2)):
        assert unused_port() == base + 1
        with pytest.raises(RuntimeError, match="no unused port"):
            unused_port()


def test_a_kernel_that_hands_out_every_port_still_gets_one(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65535))
    port = unused_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
