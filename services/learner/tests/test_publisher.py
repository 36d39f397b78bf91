"""Publishing while the next step trains (`pipeline.publish_in_background`), through the real weight-broadcast hub:
the loop goes on while a version is being sent, the version arrives as it was staged though the model changed
after, a failed send fails the loop at its next publish, and validation waits for its version's send."""

from __future__ import annotations

import threading
import uuid

import grpc
import pytest
import torch

from scalerl.weights.grpc import GrpcStreamTransport
from scalerl_learner.publisher import Publisher

from test_outages import Hub, Server


def weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"model.embed_tokens.weight": torch.randn(64, 32, generator=g),
            "model.norm.weight": torch.randn(32, generator=g).to(torch.bfloat16)}


def train_a_step(tensors: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for t in tensors.values():
            t.add_(0.5)


def same_bytes(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return sorted(a) == sorted(b) and all(
        a[k].contiguous().view(torch.uint8).equal(b[k].contiguous().view(torch.uint8)) for k in a)


@pytest.fixture
def job():
    return f"job-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def hub():
    """The hub's address, not serving until the test starts it (a hub restarting, or slow to answer)."""
    data = Hub()
    server = Server(data.add, on_stop=data.stop)
    yield server
    server.stop()


def latest(addr: str, job: str) -> dict[str, torch.Tensor]:
    receiver = GrpcStreamTransport(addr, timeout_s=30)
    try:
        version = receiver.latest_version(job)
        return version, dict(receiver.fetch(job, version).named_tensors())
    finally:
        receiver.close()


def test_the_loop_trains_on_while_its_version_waits_for_the_hub_and_the_version_arrives_as_staged(hub, job):
    transport = GrpcStreamTransport(hub.addr, timeout_s=60)
    publisher = Publisher(transport, job, background=True)
    tensors = weights()
    staged = {k: v.clone() for k, v in tensors.items()}
    try:
        publisher.publish(1, tensors)  # returns though nothing can be sent yet
        assert not publisher.wait_sent(1, timeout=0.5) and publisher.sent_version == -1
        train_a_step(tensors)  # the next step changes the model while v1 waits
        hub.start()
        assert publisher.flush(timeout=60)
        assert publisher.sent_version == 1 and publisher.wait_sent(1, timeout=0)
        version, got = latest(hub.addr, job)
        assert version == 1 and same_bytes(got, staged)
    finally:
        publisher.close(timeout=10)
        transport.close()


def test_in_the_foreground_the_loop_waits_for_the_hub(hub, job):
    transport = GrpcStreamTransport(hub.addr, timeout_s=60)
    publisher = Publisher(transport, job, background=False)
    tensors = weights()
    loop = threading.Thread(target=publisher.publish, args=(1, tensors))
    try:
        loop.start()
        loop.join(timeout=1.0)
        assert loop.is_alive()  # held by the send
        hub.start()
        loop.join(timeout=60)
        assert not loop.is_alive() and publisher.sent_version == 1
        assert same_bytes(latest(hub.addr, job)[1], tensors)
    finally:
        hub.start() if hub.server is None else None
        loop.join(timeout=60)
        transport.close()


def test_a_failed_send_fails_the_loop_at_its_next_publish(hub, job):
    """The hub stays away past the transport's deadline: the send fails on its thread, within that deadline (it
    took 30 s, asking the hub for its data port, before the port lookup got the deadline), and the loop learns it
    at its next publish, as a publish in the loop would have failed it a step earlier; a validation waiting for
    that version is told it never arrived."""
    transport = GrpcStreamTransport(hub.addr, timeout_s=1.0)
    publisher = Publisher(transport, job, background=True)
    tensors = weights()
    sent: list[int] = []
    publisher.on_sent = lambda version, seconds: sent.append(version)
    try:
        publisher.publish(1, tensors)
        with pytest.raises(grpc.RpcError) as err:
            publisher.flush(timeout=15)  # False, not an error, if the send were still trying
        assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        assert publisher.wait_sent(1, timeout=0) is False
        publisher.publish(2, tensors)
        with pytest.raises(grpc.RpcError):
            publisher.publish(3, tensors)  # v2's failure, at the next publish
        assert sent == [] and publisher.sent_version == -1
        hub.start()
        publisher.publish(3, tensors)  # each error is raised once; the loop (a resumed job) goes on
        assert publisher.flush(timeout=60) and sent == [3]
    finally:
        publisher.close(timeout=10)
        transport.close()


def test_a_republish_goes_between_the_loops_sends(hub, job):
    """Validation re-publishes an older pinned version on its own thread while the loop's next version is being
    sent: each goes whole and bit-exact, and the loop's newest stays the latest."""
    hub.start()
    transport = GrpcStreamTransport(hub.addr, timeout_s=60)
    publisher = Publisher(transport, job, background=True)
    tensors = weights()
    try:
        publisher.publish(1, tensors, pinned=True)
        v1 = {k: v.clone() for k, v in tensors.items()}
        train_a_step(tensors)
        publisher.publish(2, tensors)
        v2 = {k: v.clone() for k, v in tensors.items()}
        train_a_step(tensors)
        threads = [threading.Thread(target=publisher.republish, args=(1, v1)),
                   threading.Thread(target=publisher.publish, args=(3, tensors))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert publisher.flush(timeout=60)
        receiver = GrpcStreamTransport(hub.addr, timeout_s=30)
        try:
            assert receiver.latest_version(job) == 3
            assert same_bytes(dict(receiver.fetch(job, 1, release=True).named_tensors()), v1)
            assert same_bytes(dict(receiver.fetch(job, 3).named_tensors()), tensors)
            assert not same_bytes(v2, tensors)
        finally:
            receiver.close()
    finally:
        publisher.close(timeout=10)
        transport.close()
