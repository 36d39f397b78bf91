"""Publishing while the next step trains (`pipeline.publish_in_background`), through the real weight-broadcast hub:
the loop goes on while a version is being sent, the version arrives as it was staged though the model changed
after, a failed send fails the loop at its next publish, and validation waits for its version's send."""

from __future__ import annotations

import threading
import uuid

import grpc
import pytest
import torch

from scalerl import errors
from scalerl.weights.grpc import GrpcStreamTransport
from scalerl_learner.publisher import Publisher

from test_outages import Hub, Server


HUB_AWAY = (grpc.RpcError, errors.Unavailable)
"""How a publish fails when the hub stays away past its deadline (the data plane's PeerGone is Unavailable)."""


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
        with pytest.raises(HUB_AWAY) as err:
            publisher.flush(timeout=15)  # False, not an error, if the send were still trying
        assert not isinstance(err.value, grpc.RpcError) or err.value.code() in (
            grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        assert publisher.wait_sent(1, timeout=0) is False
        publisher.publish(2, tensors)
        with pytest.raises(HUB_AWAY):
            publisher.publish(3, tensors)  # v2's failure, at the next publish
        assert sent == [] and publisher.sent_version == -1
        hub.start()
        transport.timeout_s = 60.0  # the channel's reconnect backoff may outlast 1 s
        publisher.publish(3, tensors)  # each error is raised once; the loop (a resumed job) goes on
        assert publisher.flush(timeout=60) and sent == [3]
    finally:
        publisher.close(timeout=10)
        transport.close()


def test_a_republish_goes_after_the_send_in_flight_and_leaves_the_delta_base_alone(hub, job):
    """Validation re-publishes v1, which the hub had dropped, on its own thread while the loop's v3 is still
    being sent (the hub away): it goes after that send, whole; the loop's versions keep going as exact deltas."""
    hub.start()
    transport = GrpcStreamTransport(hub.addr, timeout_s=60, delta=True)
    publisher = Publisher(transport, job, background=True)
    tensors = weights()
    failures: list[BaseException] = []

    def recording(call, *args):
        try:
            call(*args)
        except BaseException as err:  # noqa: BLE001 - the test reads them
            failures.append(err)

    def few_words_change(step: int) -> None:
        with torch.no_grad():
            tensors["model.embed_tokens.weight"][step, :4] += 1.0

    kept = {}
    try:
        for version in (1, 2, 3, 4):  # the hub keeps 2 versions: v1 and v2 fall out
            few_words_change(version)
            publisher.publish(version, tensors)
            kept[version] = {k: v.clone() for k, v in tensors.items()}
        assert publisher.flush(timeout=60)
        hub.stop()
        few_words_change(5)
        publisher.publish(5, tensors)  # in flight until the hub is back
        kept[5] = {k: v.clone() for k, v in tensors.items()}
        republish = threading.Thread(target=recording, args=(publisher.republish, 1, kept[1]))
        republish.start()
        republish.join(timeout=1.0)
        assert republish.is_alive()  # waits for v5's send
        hub.start()  # restarted empty
        republish.join(timeout=60)
        assert not republish.is_alive() and not failures
        assert publisher.flush(timeout=60)
        few_words_change(6)
        publisher.publish(6, tensors)
        kept[6] = {k: v.clone() for k, v in tensors.items()}
        assert publisher.flush(timeout=60)
        assert transport.last_publish_sent_as == "delta"  # on v5, which the restarted hub holds
        receiver = GrpcStreamTransport(hub.addr, timeout_s=30)
        try:
            assert receiver.latest_version(job) == 6
            assert same_bytes(dict(receiver.fetch(job, 1, release=True).named_tensors()), kept[1])
            assert same_bytes(dict(receiver.fetch(job, 6).named_tensors()), kept[6])
        finally:
            receiver.close()
    finally:
        publisher.close(timeout=10)
        transport.close()


def test_a_publish_waits_out_a_hub_away_for_longer_than_one_port_lookup(hub, job, monkeypatch):
    """Asking a hub that is away for its data port runs out at LOOKUP_TIMEOUT_S (30 s); that is retried within the
    publish's deadline, instead of failing the publish (with sending in the background, the job) at 30 s."""
    monkeypatch.setattr(GrpcStreamTransport, "LOOKUP_TIMEOUT_S", 1.0)
    transport = GrpcStreamTransport(hub.addr, timeout_s=60)
    publisher = Publisher(transport, job, background=False)
    starting = threading.Timer(4.0, hub.start)
    try:
        starting.start()
        publisher.publish(1, weights())
        assert publisher.sent_version == 1
    finally:
        starting.join()
        transport.close()


def test_closing_wakes_a_validation_waiting_for_its_version(hub, job):
    transport = GrpcStreamTransport(hub.addr, timeout_s=60)
    publisher = Publisher(transport, job, background=True)
    answers: list[bool] = []
    try:
        publisher.publish(1, weights())  # the hub is away: the send keeps trying
        waiting = threading.Thread(target=lambda: answers.append(publisher.wait_sent(1, timeout=120)))
        waiting.start()
        assert publisher.close(timeout=0.5) is False  # the send is still trying
        waiting.join(timeout=10)
        assert not waiting.is_alive() and answers == [False]
    finally:
        hub.start()  # lets the send finish
        publisher.close(timeout=60)
        transport.close()


def test_the_torch_distributed_transport_is_sent_in_the_foreground(job):
    from scalerl.weights import make_transport

    transport = make_transport({"type": "torch_distributed", "addr": "127.0.0.1:1", "world_size": 2})
    assert Publisher(transport, job, background=True).background is False
    assert Publisher(GrpcStreamTransport("127.0.0.1:1"), job, background=True).background is True
