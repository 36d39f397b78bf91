"""The supervisor's plan: which ports each service is told to bind."""

from __future__ import annotations

from scalerl.ports import ephemeral_range
from scalerl_stack.supervisor import Stack


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
