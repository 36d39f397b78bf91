"""WeightBroadcast through a real gRPC server on 127.0.0.1 and the real GrpcStreamTransport client."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
import uuid
from concurrent import futures

import grpc
import pytest
from prometheus_client import REGISTRY

from scalerl import errors
from scalerl.serving import GRPC_OPTIONS, ErrorInterceptor, status_of
from scalerl.v1 import weight_broadcast_pb2 as pb
from scalerl.v1 import weight_broadcast_pb2_grpc as pb_grpc
from scalerl.weights import base as weights_base
from scalerl.weights import GrpcWeightTransportConfig, make_transport
from scalerl.weights.grpc import GrpcStreamTransport
from scalerl_weight_broadcast.service import WeightBroadcastService, add_to_server
from scalerl.weights.chunked import ChunkedVersion
from scalerl_weight_broadcast.store import VersionStore

pytestmark = pytest.mark.usefixtures("data_plane")  # every test on both data planes

KEEP = 3


class Server:
    def __init__(self, port: int = 0, keep_versions: int = KEEP, relay_fanout: int = 2):
        self.service = WeightBroadcastService(VersionStore(keep_versions=keep_versions), poll_s=0.05,
                                              relay_fanout=relay_fanout)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=32), options=GRPC_OPTIONS,
                                  interceptors=[ErrorInterceptor()])  # as start_server installs it
        add_to_server(self.service, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        assert self.port
        self.server.start()
        self.data = self.service.serve_data("127.0.0.1", 0)  # as the hub's main serves it
        self.addr = f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.data.stop()
        self.server.stop(0).wait()


@pytest.fixture
def server():
    srv = Server()
    yield srv
    srv.stop()


@pytest.fixture
def transport(server):
    t = GrpcStreamTransport(server.addr)
    yield t
    t.close()


@pytest.fixture
def job():
    return f"job-{uuid.uuid4().hex[:8]}"


class Subscriber:
    """A generator-side subscription on its own thread; received versions land in a queue."""

    def __init__(self, addr: str, job_id: str, have_version: int = -1, relay: bool = True):
        self.transport = GrpcStreamTransport(addr, relay=relay, relay_host="127.0.0.1")
        self.stop = threading.Event()
        self.received: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(job_id, have_version), daemon=True)
        self.thread.start()

    def _run(self, job_id, have_version):
        try:
            for w in self.transport.subscribe(job_id, have_version, self.stop):
                self.received.put(w)
        except BaseException as err:  # surfaced by the test
            self.error = err

    def get(self, timeout: float = 10.0):
        return self.received.get(timeout=timeout)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.transport.close()


def subscribers_gauge(job_id: str) -> float:
    return REGISTRY.get_sample_value("scalerl_weights_subscribers", {"job_id": job_id}) or 0.0


def wait_until(pred, timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def fails_with(code: grpc.StatusCode):
    """The transport's error, whichever plane raised it: a gRPC status, or the domain error the TCP plane
    carries (mapped by the one table)."""
    with pytest.raises((grpc.RpcError, errors.ScaleRLError)) as err:
        yield err
    got = err.value.code() if isinstance(err.value, grpc.RpcError) else status_of(err.value)
    assert got == code, err.value


def details(err) -> str:
    return err.value.details() if isinstance(err.value, grpc.RpcError) else str(err.value)


def raw_chunks(job_id, version, blob, chunk_bytes):
    return ChunkedVersion.from_blob(job_id, version, blob, chunk_bytes).messages()


# ---------------------------------------------------------------------------------------------------------------


def test_get_latest_is_minus_one_before_any_publish(transport, job):
    assert transport.latest_version(job) == -1


def test_publish_then_subscribe_receives_blob_intact(server, transport, job):
    blob = os.urandom(100_003)
    transport.publish_bytes(job, 0, blob)
    info = pb_grpc.WeightBroadcastStub(transport._channel).GetLatest(pb.GetLatestRequest(job_id=job))
    assert (info.version, info.total_bytes) == (0, len(blob))
    assert info.digest == ChunkedVersion.from_blob(job, 0, blob, weights_base.CHUNK_BYTES).digest.hex()

    sub = Subscriber(server.addr, job, have_version=-1)
    try:
        got = sub.get()
        assert got.job_id == job and got.version == 0
        assert got.blob == blob
    finally:
        sub.close()
    assert sub.error is None


def test_make_transport(server):
    t = make_transport(GrpcWeightTransportConfig(addr=server.addr))
    assert isinstance(t, GrpcStreamTransport)
    t.close()
    with pytest.raises(ValueError, match="type"):
        make_transport({"type": "carrier-pigeon", "addr": server.addr})


def test_multi_chunk_blob_over_default_chunk_size(server, transport, job):
    blob = os.urandom(2 * weights_base.CHUNK_BYTES + 12_345)  # 3 chunks at the default chunk size
    transport.publish_bytes(job, 1, blob)
    chunks = list(pb_grpc.WeightBroadcastStub(transport._channel).Fetch(pb.FetchRequest(job_id=job, version=1)))
    assert [c.index for c in chunks] == [0, 1, 2]
    assert {c.total_chunks for c in chunks} == {3}
    assert b"".join(c.data for c in chunks) == blob
    sub = Subscriber(server.addr, job)
    try:
        got = sub.get()
        assert got.version == 1 and got.blob == blob
    finally:
        sub.close()


def test_many_small_chunks(job):
    server = Server()
    transport = GrpcStreamTransport(server.addr, chunk_bytes=1000)
    blob = os.urandom(10_500)  # 11 chunks, the last one partial
    transport.publish_bytes(job, 3, blob)
    chunks = list(pb_grpc.WeightBroadcastStub(transport._channel).Fetch(pb.FetchRequest(job_id=job, version=3)))
    assert len(chunks) == 11 and len(chunks[-1].data) == 500
    assert transport.fetch(job, 3).blob == blob
    sub = Subscriber(server.addr, job)
    try:
        assert sub.get().blob == blob
    finally:
        sub.close()
        transport.close()
        server.stop()


def test_empty_blob_round_trips(server, transport, job):
    transport.publish_bytes(job, 0, b"")
    got = transport.fetch(job, 0)
    assert got.blob == b""


def test_late_subscriber_gets_only_the_latest_version(server, transport, job):
    blobs = {v: os.urandom(5000 + v) for v in (1, 2, 3)}
    for v, b in blobs.items():
        transport.publish_bytes(job, v, b)
    sub = Subscriber(server.addr, job, have_version=0)
    try:
        got = sub.get()
        assert got.version == 3 and got.blob == blobs[3]
        with pytest.raises(queue.Empty):
            sub.get(timeout=0.3)
        # and it keeps following: the next version arrives too
        transport.publish_bytes(job, 4, b"four")
        got = sub.get()
        assert (got.version, got.blob) == (4, b"four")
    finally:
        sub.close()


def test_subscriber_already_up_to_date_waits(server, transport, job):
    transport.publish_bytes(job, 5, b"five")
    sub = Subscriber(server.addr, job, have_version=5)
    try:
        with pytest.raises(queue.Empty):
            sub.get(timeout=0.3)
        transport.publish_bytes(job, 6, b"six")
        assert sub.get().version == 6
    finally:
        sub.close()


def test_fan_out_every_subscriber_gets_every_version(server, transport, job):
    subs = [Subscriber(server.addr, job, relay=False) for _ in range(4)]  # all streamed from the hub
    try:
        wait_until(lambda: subscribers_gauge(job) == 4, what="4 open subscriptions")
        for v in range(1, 6):
            blob = os.urandom(300_000) + bytes([v])
            transport.publish_bytes(job, v, blob)  # published once
            for s in subs:
                got = s.get()
                assert (got.version, got.blob) == (v, blob)
        for s in subs:
            with pytest.raises(queue.Empty):
                s.get(timeout=0.1)  # each version exactly once
        sent = REGISTRY.get_sample_value("scalerl_weights_sent_bytes_total", {"job_id": job})
        published = REGISTRY.get_sample_value("scalerl_weights_published_bytes_total", {"job_id": job})
        assert published > 5 * 300_001 and sent == 4 * published  # what arrived, forwarded as-is
    finally:
        for s in subs:
            s.close()
    assert all(s.error is None for s in subs)


def test_jobs_are_isolated(server, transport, job):
    other = job + "-other"
    sub = Subscriber(server.addr, other)
    try:
        transport.publish_bytes(job, 1, b"mine")
        with pytest.raises(queue.Empty):
            sub.get(timeout=0.3)
        transport.publish_bytes(other, 7, b"theirs")
        got = sub.get()
        assert (got.job_id, got.version, got.blob) == (other, 7, b"theirs")
    finally:
        sub.close()


def test_slow_subscriber_does_not_slow_the_learner(server, transport, job):
    stub = pb_grpc.WeightBroadcastStub(transport._channel)
    stalled = stub.Subscribe(pb.SubscribeRequest(job_id=job, have_version=-1))  # never read from
    try:
        wait_until(lambda: subscribers_gauge(job) == 1, what="the stalled subscription")
        blob = os.urandom(max(8 << 20, 3 * weights_base.CHUNK_BYTES))
        t0 = time.monotonic()
        for v in range(1, 4):
            transport.publish_bytes(job, v, blob)
        assert time.monotonic() - t0 < 10
        assert transport.latest_version(job) == 3
    finally:
        stalled.cancel()


def test_fetch_pinned_version_and_not_found_after_eviction(server, transport, job):
    blobs = {v: os.urandom(2000) + bytes([v]) for v in range(1, 6)}
    for v, b in blobs.items():
        transport.publish_bytes(job, v, b)
    # the last KEEP versions are kept
    for v in range(6 - KEEP, 6):
        got = transport.fetch(job, v)
        assert (got.version, got.blob) == (v, blobs[v])
    for v in range(1, 6 - KEEP):
        with fails_with(grpc.StatusCode.NOT_FOUND) as err:
            transport.fetch(job, v)
        assert "version" in details(err) and str(v) in details(err)
    with fails_with(grpc.StatusCode.NOT_FOUND):
        transport.fetch("no-such-job", 1)


@pytest.mark.parametrize("version", [4, 3])
def test_publishing_a_version_that_is_not_newer_is_rejected(transport, job, version):
    transport.publish_bytes(job, 4, b"v4")
    with fails_with(grpc.StatusCode.INVALID_ARGUMENT) as err:
        transport.publish_bytes(job, version, b"again")
    assert "not newer" in details(err)
    assert transport.latest_version(job) == 4
    assert transport.fetch(job, 4).blob == b"v4"


def test_a_byte_flipped_in_transit_is_rejected_where_it_arrives(transport, job):
    stub = pb_grpc.WeightBroadcastStub(transport._channel)
    chunks = list(raw_chunks(job, 1, os.urandom(5000), 1000))
    chunks[2].data = chunks[2].data[:7] + bytes([chunks[2].data[7] ^ 0x10]) + chunks[2].data[8:]
    with pytest.raises(grpc.RpcError) as err:
        stub.Publish(iter(chunks))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "chunk_hash" in err.value.details() and "chunk 2" in err.value.details()
    assert transport.latest_version(job) == -1


def test_a_wrong_version_digest_is_rejected(transport, job):
    stub = pb_grpc.WeightBroadcastStub(transport._channel)
    blob = os.urandom(5000)
    stub.Publish(raw_chunks(job, 1, blob, 1000))
    assert transport.fetch(job, 1).blob == blob
    chunks = list(raw_chunks(job, 2, blob, 1000))
    chunks[-1].digest = bytes(16)
    with pytest.raises(grpc.RpcError) as err:
        stub.Publish(iter(chunks))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "digest" in err.value.details()
    assert transport.latest_version(job) == 1


@pytest.mark.parametrize("case", ["no_chunks", "no_job", "bad_index", "mixed_version", "short", "missing"])
def test_malformed_publish_is_invalid_argument(transport, job, case):
    stub = pb_grpc.WeightBroadcastStub(transport._channel)
    blob = os.urandom(3000)
    chunks = list(raw_chunks(job, 1, blob, 1000))
    if case == "no_chunks":
        chunks = []
    elif case == "no_job":
        chunks = list(raw_chunks("", 1, blob, 1000))
    elif case == "bad_index":
        chunks[1].index = 2
    elif case == "mixed_version":
        chunks[2].version = 2
    elif case == "short":
        chunks = chunks[:2]
    elif case == "missing":  # a message lost in the middle
        del chunks[1]
    with pytest.raises(grpc.RpcError) as err:
        stub.Publish(iter(chunks))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert transport.latest_version(job) == -1


def test_subscription_stops_when_stop_event_is_set(server, job):
    sub = Subscriber(server.addr, job)
    wait_until(lambda: subscribers_gauge(job) == 1, what="the subscription")
    sub.stop.set()
    sub.thread.join(timeout=3)
    assert not sub.thread.is_alive()
    assert sub.error is None
    wait_until(lambda: subscribers_gauge(job) == 0, what="the server to close the subscription")
    sub.transport.close()


def test_closing_the_subscription_generator_ends_the_server_stream(server, transport, job):
    transport.publish_bytes(job, 1, b"x")
    gen = transport.subscribe(job, -1, threading.Event())
    assert next(gen).version == 1
    assert subscribers_gauge(job) == 1
    gen.close()
    wait_until(lambda: subscribers_gauge(job) == 0, what="the server to close the subscription")


def test_subscriber_resubscribes_after_the_service_restarts(job):
    first = Server()
    port = first.port
    t = GrpcStreamTransport(first.addr)
    t.publish_bytes(job, 1, b"one")
    sub = Subscriber(first.addr, job)
    second = None
    try:
        assert sub.get().version == 1
        first.stop()
        second = Server(port=port)
        t.publish_bytes(job, 2, b"two")  # the new instance holds only what is published to it
        got = sub.get(timeout=10)
        assert (got.version, got.blob) == (2, b"two")
    finally:
        sub.close()
        t.close()
        if second is not None:
            second.stop()


def put(store: VersionStore, job_id: str, version: int, blob: bytes, pinned: bool = False) -> ChunkedVersion:
    messages = list(ChunkedVersion.from_blob(job_id, version, blob, 1024).messages(pinned=pinned))
    incoming = store.begin(messages[0])
    for m in messages:
        incoming.add(None, m)
    return store.complete(incoming)


def test_pinned_version_outlives_the_ring_until_released():
    store = VersionStore(keep_versions=2)
    put(store, "job", 0, b"v0", pinned=True)
    for v in range(1, 6):
        put(store, "job", v, f"v{v}".encode())
    assert store.get("job", 1) is None  # evicted from the ring
    assert store.get("job", 0).blob == b"v0"  # pinned for validation
    assert store.get("job", 0, release=True).blob == b"v0"
    assert store.get("job", 0) is None


def test_a_version_queued_for_validation_can_be_pinned_again_after_it_was_lost(transport, job):
    """The evaluator released v2 and died (or this service restarted): the learner publishes v2 again, pinned,
    although v5 is the latest; it is fetchable until released, and subscribers still get v5 only."""
    transport.publish_bytes(job, 2, b"v2", pinned=True)
    assert transport.fetch(job, 2, release=True).blob == b"v2"  # the evaluator took it, then died
    for v in range(3, 3 + KEEP):
        transport.publish_bytes(job, v, f"v{v}".encode())
    with fails_with(grpc.StatusCode.NOT_FOUND):
        transport.fetch(job, 2)

    transport.publish_bytes(job, 2, b"v2", pinned=True)
    assert transport.latest_version(job) == 2 + KEEP
    assert transport.fetch(job, 2, release=True).blob == b"v2"
    stop = threading.Event()
    first = next(iter(transport.subscribe(job, -1, stop)))
    stop.set()
    assert first.version == 2 + KEEP
    with fails_with(grpc.StatusCode.INVALID_ARGUMENT):  # not pinned: still refused
        transport.publish_bytes(job, 2, b"v2")


def test_an_ended_jobs_versions_and_series_are_dropped(server, transport):
    """The hub follows the control plane's active job: an ended job's versions (GBs each for a real model) leave
    memory and its series go, once two answers in a row do not name it; the active job is untouched."""
    ended, active = f"job-{uuid.uuid4().hex[:8]}", f"job-{uuid.uuid4().hex[:8]}"
    for job_id in (ended, active):
        transport.publish_bytes(job_id, 1, b"x" * 4096)
    version = lambda job_id: REGISTRY.get_sample_value("scalerl_weights_version", {"job_id": job_id})  # noqa: E731
    assert version(ended) == version(active) == 1
    server.service.keep_only(active)  # first answer without `ended`: it may be a job that just started
    assert transport.latest_version(ended) == 1
    server.service.keep_only(active)
    assert transport.latest_version(ended) == -1 and version(ended) is None
    assert transport.latest_version(active) == 1 and version(active) == 1
    server.service.keep_only(None)
    server.service.keep_only(None)
    assert server.service.store.job_ids() == set() and version(active) is None


def test_a_job_named_again_is_kept(server, transport, job):
    transport.publish_bytes(job, 1, b"y" * 1024)
    server.service.keep_only(None)  # an answer from before the job started
    server.service.keep_only(job)
    server.service.keep_only(None)  # ended: absent once
    assert transport.latest_version(job) == 1


def test_a_publish_waits_out_a_hub_restart(job):
    """The hub (weight-broadcast) dies in the middle of a publish and comes back on its address: the learner's
    publish is retried until the hub answers and the version lands whole (chaos: a job failed on "Stream
    removed" when the hub was killed mid-publish)."""
    first = Server()
    port = first.port
    publisher = GrpcStreamTransport(first.addr, chunk_bytes=64 << 10, timeout_s=60)
    blob = os.urandom(96 << 20)  # long enough to be mid-stream when the hub dies
    restarted: list[Server] = []

    def kill_then_restart() -> None:
        time.sleep(0.05)
        first.stop()  # the process dies: every open stream is cut (gRPC and the data plane)
        time.sleep(1.0)
        restarted.append(Server(port=port))

    chaos = threading.Thread(target=kill_then_restart)
    try:
        chaos.start()
        publisher.publish_bytes(job, 1, blob)
        chaos.join()
        reader = GrpcStreamTransport(restarted[0].addr)
        try:
            got = reader.fetch(job, 1)
        finally:
            reader.close()
        assert got.version == 1 and bytes(got.blob) == blob
    finally:
        chaos.join()
        publisher.close()
        for server in restarted:
            server.stop()


def test_concurrent_fetches_of_one_version_all_get_it(transport, job):
    """The evaluator may fetch the same pinned version for two eval sets at once."""
    blobs = {v: os.urandom(30_000) for v in (1, 2)}
    for v, blob in blobs.items():
        transport.publish_bytes(job, v, blob)
    got, failures = [], []

    def fetch_some():
        try:
            for v in (2, 1, 2, 1, 2, 2):
                got.append((v, bytes(transport.fetch(job, v).blob)))
        except Exception as err:  # surfaced below
            failures.append(err)

    threads = [threading.Thread(target=fetch_some) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not failures, failures
    assert len(got) == 48 and all(blob == blobs[v] for v, blob in got)


def test_a_pinned_re_publish_from_another_thread_leaves_every_version_whole(server, transport, job):
    """The learner's training loop publishes v1..v12 (deltas against its last version) while its validation thread
    re-publishes a pinned v1 over and over: every version the hub holds is exactly what was published (the two
    never stage into one buffer, and the deltas keep their base)."""
    import torch

    from scalerl.weights.codec import to_safetensors

    def state(v: int) -> dict:
        w = torch.arange(64 * 1024, dtype=torch.float32)
        w[v * 100:(v + 1) * 100] = -v  # a few chunks change per version: published as deltas
        return {"w": w, "b": torch.full((1000,), float(v))}

    transport.publish(job, 1, state(1), pinned=True)
    done, errs = threading.Event(), []

    def revalidate():
        while not done.is_set():
            try:
                transport.publish(job, 1, state(1), pinned=True)
            except Exception as err:  # noqa: BLE001 - surfaced below
                errs.append(err)
                return

    other = threading.Thread(target=revalidate, daemon=True)
    other.start()
    try:
        for v in range(2, 13):
            transport.publish(job, v, state(v))
    finally:
        done.set()
        other.join(30)
    assert not errs, errs
    for v in (1, *range(13 - KEEP, 13)):
        assert bytes(transport.fetch(job, v).blob) == bytes(to_safetensors(state(v))), v
