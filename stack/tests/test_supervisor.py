"""The supervisor's plan: which ports each service is told to bind."""

from __future__ import annotations

import socket

import pytest

from scalerl.ports import ephemeral_range, unused_port
from scalerl_stack.supervisor import PortsInUse, Stack


def test_planned_free_ports_are_distinct_and_outside_the_ephemeral_range(tmp_path):
    """A planned port inside the range could be taken as the local port of an outgoing connection before its
    service binds it (CI: generator-0's metrics port, held through all five restarts)."""
    stack = Stack(tmp_path, generators=3, free_ports=True, learner_ranks=2)
    stack.plan()
    planned = [port for p in stack.procs for port in (p.grpc_port, p.metrics_port)]
    low, high = ephemeral_range()
    assert len(planned) == 2 * len(stack.procs) == 2 * 10
    assert len(set(planned)) == len(planned)
    assert [p for p in planned if low <= p <= high] == []


def test_default_ports_lie_below_every_kernels_ephemeral_range(tmp_path):
    """`make run`'s fixed ports: a default inside the range was seen held as an outgoing connection's local port
    (the weight-broadcast's 50056, during make test)."""
    stack = Stack(tmp_path, generators=4)
    stack.plan()
    planned = [port for p in stack.procs for port in (p.grpc_port, p.metrics_port)] + [stack.http_port]
    low = min(ephemeral_range()[0], 32768, 49152)
    assert len(set(planned)) == len(planned) == 2 * len(stack.procs) + 1
    assert [p for p in planned if p >= low] == []


def test_a_port_something_listens_on_stops_the_start_before_any_service(tmp_path, monkeypatch):
    """Not five crash-looping restarts and a timeout minutes later: the start fails at once, naming the port."""
    monkeypatch.setenv("SCALERL_HTTP_PORT", str(unused_port()))
    stack = Stack(tmp_path, free_ports=True, redis_url="redis://127.0.0.1:1/0")
    taken = unused_port()
    monkeypatch.setattr(stack, "_ports", lambda name: (taken if name == "replay-buffer" else unused_port(),
                                                       unused_port()))
    with socket.create_server(("127.0.0.1", taken)):
        try:
            with pytest.raises(PortsInUse, match=f"replay-buffer gRPC port {taken}"):
                stack.start()
        finally:
            stack.stop(timeout=5)
    assert all(p.proc is None for p in stack.procs)
