"""Relayed fan-out, delta updates and per-chunk integrity through the real hub and real relay servers (every
subscriber is a real GrpcStreamTransport with its own relay gRPC server on 127.0.0.1)."""

from __future__ import annotations

import os
import queue
import threading
import uuid

import grpc
import pytest
import torch
from prometheus_client import REGISTRY

from scalerl.v1 import weight_broadcast_pb2 as pb
from scalerl.weights.chunked import VersionStore
from scalerl.weights import tcp
from scalerl.weights.grpc import DeltaChoice, GrpcStreamTransport, RelayServer, TcpRelay, subscribe_method

from test_weight_broadcast import Server, Subscriber, put, wait_until

pytestmark = pytest.mark.usefixtures("planes_and_checks")  # both planes; on TCP both ways of checking

CHUNK = 16 * 1024


@pytest.fixture
def job():
    return f"job-{uuid.uuid4().hex[:8]}"


def hub_sent(job_id: str) -> float:
    return REGISTRY.get_sample_value("scalerl_weights_sent_bytes_total", {"job_id": job_id}) or 0.0


def members(server: Server, job_id: str) -> int:
    return server.service.tree.members(job_id)


def close_all(subs) -> None:
    for s in subs:
        s.stop.set()
    for s in subs:
        s.close()


@pytest.mark.parametrize("n", [1, 4, 8])
def test_the_hub_sends_each_byte_at_most_fanout_times(job, n):
    server = Server(relay_fanout=2)
    publisher = GrpcStreamTransport(server.addr, chunk_bytes=CHUNK, delta=False)
    subs = [Subscriber(server.addr, job) for _ in range(n)]
    try:
        wait_until(lambda: members(server, job) == n, what=f"{n} relay members")
        size = 0
        for v in range(3):
            blob = os.urandom(400_000 + v)
            size += len(blob)
            publisher.publish_bytes(job, v, blob)
            for s in subs:
                got = s.get()
                assert (got.version, got.blob) == (v, blob)
        # frames carry ~60 bytes of header per 16 KiB chunk on top of the data
        assert hub_sent(job) <= min(n, 2) * size * 1.01
        assert all(s.error is None for s in subs)
    finally:
        close_all(subs)
        publisher.close()
        server.stop()


def test_a_chain_relays_every_version_and_the_hub_streams_it_once(job):
    server = Server(relay_fanout=1)
    publisher = GrpcStreamTransport(server.addr, chunk_bytes=CHUNK, delta=False)
    subs = [Subscriber(server.addr, job) for _ in range(4)]
    try:
        wait_until(lambda: members(server, job) == 4, what="4 relay members")
        blob = os.urandom(1_000_000)
        publisher.publish_bytes(job, 1, blob)
        assert all(s.get().blob == blob for s in subs)
        assert hub_sent(job) <= len(blob) * 1.01
        # the chain: every relay but the last forwarded the version once
        assert sorted(r.sent_bytes > 0 for s in subs for r in s.transport.relays) == [False, True, True, True]
    finally:
        close_all(subs)
        publisher.close()
        server.stop()


def test_a_generator_joining_mid_run_gets_the_latest_through_a_relay_without_stalling_the_others(job):
    server = Server(relay_fanout=1)
    publisher = GrpcStreamTransport(server.addr, chunk_bytes=CHUNK, delta=False)
    subs = [Subscriber(server.addr, job) for _ in range(2)]
    stalled = None
    late = None
    try:
        wait_until(lambda: members(server, job) == 2, what="2 relay members")
        blobs = {v: os.urandom(300_000) for v in range(1, 7)}
        for v in (1, 2, 3):
            publisher.publish_bytes(job, v, blobs[v])
            assert all(s.get().version == v for s in subs)
        before = hub_sent(job)
        # a peer of the last relay that never reads: it must not hold up that relay or anyone else
        stalled = stalled_peer(subs[-1].transport.relays[0].addr, job)
        late = Subscriber(server.addr, job, have_version=-1)
        got = late.get()
        assert (got.version, got.blob) == (3, blobs[3])  # the latest, from a relay:
        assert hub_sent(job) == before  # the hub sent nothing for it
        for v in (4, 5, 6):
            publisher.publish_bytes(job, v, blobs[v])
            for s in (*subs, late):
                got = s.get()
                assert (got.version, got.blob) == (v, blobs[v])
    finally:
        if stalled is not None:
            stalled()
        close_all(subs + ([late] if late else []))
        publisher.close()
        server.stop()


def test_a_relay_that_dies_is_routed_around(job):
    server = Server(relay_fanout=1)
    publisher = GrpcStreamTransport(server.addr, chunk_bytes=CHUNK, delta=False)
    subs = [Subscriber(server.addr, job) for _ in range(3)]
    try:
        wait_until(lambda: members(server, job) == 3, what="3 relay members")
        publisher.publish_bytes(job, 1, b"one" * 10_000)
        assert all(s.get().version == 1 for s in subs)
        subs[1].close()  # the middle of the chain
        blob = os.urandom(200_000)
        publisher.publish_bytes(job, 2, blob)
        for s in (subs[0], subs[2]):
            got = s.get(timeout=20)
            assert (got.version, got.blob) == (2, blob)
    finally:
        close_all([subs[0], subs[2]])
        publisher.close()
        server.stop()


def stalled_peer(addr: str, job: str):
    """Subscribe at a relay and never read; returns how to hang up."""
    request = pb.SubscribeRequest(job_id=job, have_version=-1)
    if GrpcStreamTransport.__init__.__kwdefaults__["data_plane"] == "tcp":
        sock = tcp.subscribe(addr, request)
        return sock.close
    channel = grpc.insecure_channel(addr)
    call = subscribe_method(channel)(request)
    return lambda: (call.cancel(), channel.close())


def flip(data) -> bytes:
    data = bytes(data)
    return data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 1]) + data[len(data) // 2 + 1:]


class CorruptingRelay(RelayServer):
    """A peer whose network flips one bit in a chunk it forwards."""

    def _subscribe(self, request, context):
        for frame in super()._subscribe(request, context):
            yield flip(frame)


class CorruptingTcpRelay(TcpRelay):
    """The same peer on the TCP data plane."""

    def send(self, conn, header, data):
        super().send(conn, header, flip(data))


def test_a_byte_flipped_by_a_relay_is_detected_and_the_relay_left(job):
    server = Server(relay_fanout=1)
    publisher = GrpcStreamTransport(server.addr, chunk_bytes=CHUNK, delta=False)
    blob = os.urandom(100_000)
    publisher.publish_bytes(job, 1, blob)
    bad_store = VersionStore()
    put(bad_store, job, 1, blob)
    tcp_plane = GrpcStreamTransport.__init__.__kwdefaults__["data_plane"] == "tcp"
    bad = (CorruptingTcpRelay if tcp_plane else CorruptingRelay)(bad_store, "127.0.0.1")
    hub = pb_stub = None
    try:
        from scalerl.v1 import weight_broadcast_pb2_grpc

        hub = grpc.insecure_channel(server.addr)
        pb_stub = weight_broadcast_pb2_grpc.WeightBroadcastStub(hub)
        assert pb_stub.Join(pb.JoinRequest(job_id=job, subscriber_id="bad", relay_addr=bad.addr)).parent_addr == ""
        sub = Subscriber(server.addr, job)
        try:
            got = sub.get(timeout=20)  # first from the corrupting peer (rejected), then from the hub
            assert (got.version, got.blob) == (1, blob)
            assert bad.sent_bytes > 0
            with pytest.raises(queue.Empty):
                sub.get(timeout=0.3)  # the corrupt copy was never handed to the generator
        finally:
            sub.close()
    finally:
        bad.stop()
        if hub is not None:
            hub.close()
        publisher.close()
        server.stop()


# ---------------------------------------------------------------------------------------------------- deltas
def model_state(g: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "embed.weight": torch.randn(64, 48, generator=g).to(torch.bfloat16),
        "layers.0.mlp.weight": torch.randn(96, 48, generator=g).to(torch.bfloat16),
        "layers.0.norm.weight": torch.randn(48, generator=g),  # fp32
        "lm_head.weight": torch.randn(64, 48, generator=g),
    }


def special_bits(t: torch.Tensor, g: torch.Generator) -> None:
    """-0.0, +0.0 and NaNs with distinct payloads at random places (equal as floats, not as bits)."""
    words = t.view(torch.int16 if t.element_size() == 2 else torch.int32).view(-1)
    sign = -0x8000 if t.element_size() == 2 else -0x80000000
    nan = 0x7FC1 if t.element_size() == 2 else 0x7FC00001
    idx = torch.randint(0, words.numel(), (3,), generator=g)
    words[idx[0]] = sign  # -0.0
    words[idx[1]] = 0
    words[idx[2]] = nan + int(torch.randint(0, 30, (1,), generator=g))


def test_fifty_delta_updates_are_bit_exact_through_the_service(job):
    server = Server(relay_fanout=1)
    publisher = GrpcStreamTransport(server.addr, chunk_bytes=4096, delta=True)
    subs = [Subscriber(server.addr, job) for _ in range(2)]  # the second gets its deltas through the first
    g = torch.Generator().manual_seed(17)
    state = model_state(g)
    try:
        wait_until(lambda: members(server, job) == 2, what="2 relay members")
        full = None
        for v in range(51):
            if v:
                for t in state.values():  # a sparse optimizer step: ~2% of the elements change
                    flat = t.view(-1)
                    idx = torch.randint(0, flat.numel(), (max(1, flat.numel() // 50),), generator=g)
                    flat[idx] = (flat[idx].float() + torch.randn(len(idx), generator=g) * 1e-2).to(t.dtype)
                    special_bits(t, g)
            publisher.publish(job, v, state)
            if v == 0:
                full = publisher.last_publish_bytes
            else:
                assert publisher.last_publish_bytes < full / 2, v  # sent as a delta
            for s in subs:
                got = dict(s.get().named_tensors())
                assert sorted(got) == sorted(state)
                for name, t in state.items():
                    assert got[name].dtype == t.dtype
                    assert got[name].view(torch.uint8).equal(t.contiguous().view(torch.uint8)), (v, name)
        # a subscriber that starts now holds no base: it gets the whole latest version
        late = Subscriber(server.addr, job)
        try:
            got = dict(late.get().named_tensors())
            assert all(got[n].view(torch.uint8).equal(t.view(torch.uint8)) for n, t in state.items())
        finally:
            late.close()
        assert all(s.error is None for s in subs)
    finally:
        close_all(subs)
        publisher.close()
        server.stop()


def test_a_delta_on_a_base_the_hub_lost_is_sent_whole(job):
    first = Server()
    publisher = GrpcStreamTransport(first.addr, chunk_bytes=4096, delta=True)
    blob = bytearray(os.urandom(50_000))
    publisher.publish_bytes(job, 1, bytes(blob))
    port = first.port
    first.stop()
    second = Server(port=port)  # restarted: holds nothing
    try:
        blob[10] ^= 0xFF
        publisher.publish_bytes(job, 2, bytes(blob))
        assert publisher.last_publish_bytes >= len(blob)  # whole, not a delta
        assert publisher.fetch(job, 2).blob == bytes(blob)
    finally:
        publisher.close()
        second.stop()


def test_auto_takes_the_faster_way_and_tries_the_other_again_every_probe_every_publishes():
    choice = DeltaChoice("auto", probe_every=4)
    assert choice.use_delta("a")  # nothing timed yet: a delta first
    choice.record(True, 3.0)
    assert not choice.use_delta("a")  # whole versions not timed yet
    choice.record(False, 1.0)
    assert [choice.use_delta("a") for _ in range(8)] == [False, False, False, True] * 2  # every 4th: a delta
    for _ in range(2):
        choice.record(True, 0.2)  # deltas got cheaper than whole versions (median 0.2 s)
    assert [choice.use_delta("a") for _ in range(4)] == [True, True, True, False]
    choice.record(True, 60.0)  # one slow delta (the hub away) does not flip the choice
    assert choice.use_delta("a")
    assert choice.use_delta("b") and choice.seconds == {}  # another job: timed afresh
    assert all(DeltaChoice(True).use_delta("a") for _ in range(20))
    assert not any(DeltaChoice(False).use_delta("a") for _ in range(20))


def test_auto_times_both_ways_on_the_service_and_every_version_arrives_whole(job):
    server = Server()
    publisher = GrpcStreamTransport(server.addr, chunk_bytes=4096)  # delta: auto, the default
    sub = Subscriber(server.addr, job)
    blob = bytearray(os.urandom(200_000))
    try:
        sizes = []
        for v in range(8):
            blob[(v * 7919) % len(blob)] ^= 0x5A
            publisher.publish_bytes(job, v, bytes(blob))
            sizes.append(publisher.last_publish_bytes)
            assert bytes(sub.get().blob) == bytes(blob), v
        assert set(publisher.delta.seconds) == {True, False}
        assert min(sizes) < len(blob) // 10 and max(sizes) >= len(blob)  # both ways were used
        assert sub.error is None
    finally:
        close_all([sub])
        publisher.close()
        server.stop()
