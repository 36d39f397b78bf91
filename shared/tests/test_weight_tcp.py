"""The raw TCP data plane (`scalerl.weights.tcp`) against a real DataServer on 127.0.0.1: reused receive buffers
that never overwrite a version someone still holds, zero-copy tensors, and bad input refused with the field named
while the server keeps serving."""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
import uuid

import pytest
import torch
from safetensors.torch import load, save

from scalerl import errors
from scalerl.ports import unused_port
from scalerl.v1 import weight_broadcast_pb2 as pb
from scalerl.weights import chunked, tcp
from scalerl.weights.chunked import BufferPool, ChunkedVersion, VersionStore
from scalerl.weights.codec import SafetensorsBlob, tensors_of

pytestmark = pytest.mark.usefixtures("verify_threads")  # both ways of verifying arriving chunks


@pytest.fixture
def hub():
    store = VersionStore(keep_versions=2)
    published = []
    server = tcp.DataServer(store, "127.0.0.1", 0, poll_s=0.05, on_published=published.append)
    server.published = published
    yield server
    server.stop()


def addr(server: tcp.DataServer) -> str:
    return f"127.0.0.1:{server.port}"


def publish(server, job, version, blob, chunk=4096):
    entry = ChunkedVersion.from_blob(job, version, blob, chunk)
    return tcp.publish(addr(server), entry.headers(), timeout=10)


def test_publish_then_fetch_round_trips_into_one_buffer(hub):
    job = uuid.uuid4().hex
    blob = os.urandom(50_000)
    assert publish(hub, job, 1, blob).total_bytes == len(blob)
    assert len(hub.published) == 1
    got = tcp.fetch(addr(hub), pb.FetchRequest(job_id=job, version=1), 10, VersionStore(keep_versions=1))
    assert got.buffer is not None and got.blob == blob
    assert all(p.obj is got.buffer for p in got.parts)  # every chunk was received in place


def read_chunk(sock: socket.socket) -> tuple[pb.WeightChunk, bytes]:
    kind, a, b = tcp._RECORD.unpack(tcp._recv(sock, tcp._RECORD.size))
    assert kind == b"C", kind
    return pb.WeightChunk.FromString(bytes(tcp._recv(sock, a))), bytes(tcp._recv(sock, b))


def test_the_hub_and_a_relay_forward_chunk_0_before_the_publisher_sends_the_last_chunk(hub):
    """Pipelined by chunk (no hop waits for a whole version): the hub serves two subscribers, one of them a
    relay with a child; both the hub's direct subscriber and the relay's child get chunk 0 while the publisher
    still holds its last chunk back. Ordering, not timing: a hop that stored the whole version first would leave
    the readers waiting until their socket timeout."""
    job = uuid.uuid4().hex
    entry = ChunkedVersion.from_blob(job, 0, os.urandom(8 * 4096 + 100), 4096)
    messages = list(entry.headers())
    release = threading.Event()

    def held_back():
        yield from messages[:-1]
        release.wait(60)  # longer than the readers wait for chunk 0
        yield messages[-1]

    relay_store = VersionStore(keep_versions=2)
    relay = tcp.DataServer(relay_store, "127.0.0.1", 0, poll_s=0.05)
    request = pb.SubscribeRequest(job_id=job, have_version=-1)
    upstream = tcp.subscribe(addr(hub), request)
    direct = tcp.subscribe(addr(hub), request)
    child = tcp.subscribe(addr(relay), request)
    received = []

    def relay_receives():  # a subscriber's receiving thread: its store is what the relay serves
        try:
            for incoming in tcp.read_versions(upstream, relay_store):
                received.append(incoming.result)
        except (tcp.PeerGone, OSError):
            pass  # closed at the end

    relaying = threading.Thread(target=relay_receives, daemon=True)
    relaying.start()
    answers = []
    publishing = threading.Thread(target=lambda: answers.append(tcp.publish(addr(hub), held_back(), timeout=30)),
                                  daemon=True)
    try:
        for sock in (direct, child):
            sock.settimeout(30)
        publishing.start()
        for sock in (direct, child):
            first, data = read_chunk(sock)
            assert (first.seq, data) == (0, bytes(entry.parts[0]))
        assert not release.is_set() and not answers  # the last chunk is not even sent yet
        release.set()
        for sock in (direct, child):
            rest = [read_chunk(sock) for _ in range(len(messages) - 1)]
            assert [h.seq for h, _ in rest] == list(range(1, len(messages)))
            assert b"".join(d for _, d in rest) == bytes(entry.blob)[4096:]
        publishing.join(30)
        assert answers and answers[0].version == 0
    finally:
        release.set()
        for sock in (upstream, direct, child):
            sock.shutdown(socket.SHUT_RDWR)  # wakes the relay's receiving thread
            sock.close()
        relay.stop()
    relaying.join(10)
    assert received and received[0].blob == entry.blob


def test_a_buffer_is_reused_only_once_nobody_holds_the_version():
    pool = BufferPool(max_buffers=4)
    buf = pool.take(1000)
    first = id(buf)
    view = memoryview(buf)[10:20]  # what a stored version, a blob or a tensor holds
    del buf
    assert id(pool.take(1000)) != first  # a view of it is alive
    del view
    assert id(pool.take(1000)) == first  # nothing but the pool refers to it now
    assert pool.allocated == 2


def test_buffers_are_reused_while_the_store_also_holds_another_jobs_versions():
    """A hub still holding an earlier job's versions (until the control plane drops it; pins likewise) must land
    the next job's versions in reused buffers, not each in fresh memory (its page faults paid at chunk 0, before
    anything is forwarded): one more buffer per version than the store keeps, per job."""
    store = VersionStore(keep_versions=2)  # its pool keeps 4 spare buffers
    server = tcp.DataServer(store, "127.0.0.1", 0, poll_s=0.05, on_published=lambda incoming: None)
    try:
        blob = os.urandom(20_000)
        for job in (f"earlier-{uuid.uuid4().hex}", f"current-{uuid.uuid4().hex}"):
            for v in range(1, 13):
                publish(server, job, v, blob)
        assert store.pool.allocated <= 2 * (store.keep_versions + 1)
    finally:
        server.stop()


def test_a_held_version_keeps_its_bytes_while_later_versions_arrive(hub):
    """A generator still loading v1 while v2..v6 arrive (the store keeps 2): its bytes must not change."""
    job = uuid.uuid4().hex
    store = VersionStore(keep_versions=2)
    blobs = {v: os.urandom(20_000) for v in range(1, 7)}
    publish(hub, job, 1, blobs[1])
    held = SafetensorsBlob(job, 1, tcp.fetch(addr(hub), pb.FetchRequest(job_id=job, version=1), 10, store).blob)
    store.drop_job(job)
    for v in range(2, 7):
        publish(hub, job, v, blobs[v])
        got = tcp.fetch(addr(hub), pb.FetchRequest(job_id=job, version=v), 10, store)
        assert got.blob == blobs[v]
        store.drop_job(job)
        del got
    assert held.blob == blobs[1]
    assert store.pool.allocated <= 3  # the rest reused the buffer the dropped versions left


def test_tensors_are_views_of_the_received_buffer_and_equal_safetensors_load():
    g = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(7, 5, generator=g), "h": torch.randn(9, generator=g).to(torch.bfloat16),
             "i": torch.arange(6, dtype=torch.int64).view(2, 3), "b": torch.tensor([True, False]),
             "f16": torch.randn(4, generator=g).half(), "empty": torch.empty(0, 3)}
    raw = save(state)
    buf = bytearray(raw)
    got = dict(SafetensorsBlob("j", 1, memoryview(buf).toreadonly()).named_tensors())
    want = load(raw)
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape and torch.equal(got[name], t), name
    dict(tensors_of(memoryview(buf)))["w"][0, 0] = 123.0  # the tensors alias the buffer: no copy was made
    assert dict(tensors_of(memoryview(buf)))["w"][0, 0] == 123.0 and got["w"][0, 0] == 123.0


def raw_request(server, payload: bytes) -> dict:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(payload)
        head = sock.recv(9, socket.MSG_WAITALL)
        kind, a, _ = struct.unpack("<cII", head)
        assert kind == b"E", kind
        return json.loads(sock.recv(a, socket.MSG_WAITALL))


def record(header: bytes, data: bytes) -> bytes:
    return struct.pack("<cII", b"C", len(header), len(data)) + header + data


@pytest.mark.parametrize("case, code, field", [
    ("magic", "InvalidArgument", "magic"),
    ("op", "InvalidArgument", "op"),
    ("oversize_request", "ResourceExhausted", "request"),
    ("oversize_record", "ResourceExhausted", "data"),
    ("flipped_byte", "InvalidArgument", "chunk_hash"),
    ("no_job", "InvalidArgument", "job_id"),
    ("wrong_size", "InvalidArgument", "total_chunks"),
])
def test_bad_input_is_refused_naming_the_field_and_the_server_keeps_serving(hub, case, code, field):
    job = uuid.uuid4().hex
    entry = ChunkedVersion.from_blob(job, 1, os.urandom(10_000), 4096)
    first, data = next(entry.headers())
    publish_open = tcp.MAGIC + tcp.OP_PUBLISH + struct.pack("<I", 0)
    if case == "magic":
        payload = b"HTTP" + b"G" + struct.pack("<I", 0)
    elif case == "op":
        payload = tcp.MAGIC + b"Z" + struct.pack("<I", 0)
    elif case == "oversize_request":
        payload = tcp.MAGIC + tcp.OP_SUBSCRIBE + struct.pack("<I", 1 << 30)
    elif case == "oversize_record":
        payload = publish_open + struct.pack("<cII", b"C", 10, tcp.MAX_DATA_BYTES + 1)
    elif case == "flipped_byte":
        payload = publish_open + record(first.SerializeToString(), bytes([data[0] ^ 1]) + bytes(data[1:]))
    elif case == "no_job":
        first.job_id = ""
        payload = publish_open + record(first.SerializeToString(), bytes(data))
    else:
        first.total_chunks = 7
        payload = publish_open + record(first.SerializeToString(), bytes(data))
    error = raw_request(hub, payload)
    assert (error["code"], error["field"]) == (code, field), error
    blob = os.urandom(9_000)  # still serving
    publish(hub, job, 2, blob)
    assert tcp.fetch(addr(hub), pb.FetchRequest(job_id=job, version=2), 10, VersionStore()).blob == blob


def test_a_refused_publish_raises_the_domain_error_at_the_client(hub):
    job = uuid.uuid4().hex
    publish(hub, job, 3, os.urandom(100_000))
    with pytest.raises(errors.InvalidArgument, match="not newer") as err:
        publish(hub, job, 2, os.urandom(100_000))
    assert err.value.field == "version"
    with pytest.raises(errors.NotFound):
        tcp.fetch(addr(hub), pb.FetchRequest(job_id=job, version=1), 10, VersionStore())


def test_an_unreachable_peer_is_peer_gone():
    with pytest.raises(tcp.PeerGone):
        tcp.fetch(f"127.0.0.1:{unused_port()}", pb.FetchRequest(job_id="j", version=1), 2, VersionStore())


def test_a_publish_to_a_hub_that_closed_without_reading_ends_instead_of_waiting_out_its_timeout():
    """A hub shut down mid-publish can leave its end half-closed with its receive window at zero and no reset
    (seen in CI: the publish sat in `sendall` for its whole 60 s timeout, so the retry that waits out a hub restart
    never ran). Here a listener that accepts, reads nothing and closes its sending side stands for it."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        result: list[BaseException | None] = []
        entry = ChunkedVersion.from_blob("job", 1, os.urandom(64 << 20), 1 << 20)

        def publish_to(port: int) -> None:
            try:
                tcp.publish(f"127.0.0.1:{port}", entry.headers(), timeout=None)
                result.append(None)
            except BaseException as err:  # noqa: BLE001 - handed to the test's thread
                result.append(err)

        publisher = threading.Thread(target=publish_to, args=(listener.getsockname()[1],), daemon=True)
        publisher.start()
        conn, _ = listener.accept()
        with conn:
            conn.shutdown(socket.SHUT_WR)  # says it is done; its receive buffer fills and is never read
            publisher.join(30)
            ended = not publisher.is_alive()
        publisher.join(10)  # closing the hub's end with unread data resets the connection if it had not ended
    assert ended, "the publish was still sending to a hub that had closed"
    assert len(result) == 1 and isinstance(result[0], tcp.PeerGone)


def test_a_publish_slower_than_its_timeout_but_always_progressing_is_not_cut():
    """The publish timeout bounds each wait (a chunk's send, the answer), not the whole version: a 16 GB version
    over a slow link takes longer than any one wait should. A listener that takes 1 MiB every 0.1 s for 32 MiB,
    then the rest at once, then answers, stands for a slow hub."""
    entry = ChunkedVersion.from_blob("job", 1, os.urandom(40 << 20), 1 << 20)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        answer = pb.PublishResponse(version=1, total_bytes=entry.total_bytes).SerializeToString()

        def slow_hub() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
                expected = len(tcp.MAGIC) + 5 + sum(tcp._RECORD.size + len(h.SerializeToString()) + len(d)
                                                    for h, d in entry.headers())  # the opening, then records
                got = 0
                while got < expected:
                    got += len(conn.recv(min(1 << 20, expected - got)))
                    if got < 32 << 20:
                        time.sleep(0.1)
                conn.sendall(tcp._RECORD.pack(b"K", len(answer), 0) + answer)

        hub_thread = threading.Thread(target=slow_hub, daemon=True)
        hub_thread.start()
        started = time.monotonic()
        got = tcp.publish(f"127.0.0.1:{listener.getsockname()[1]}", entry.headers(), timeout=2.0)
        hub_thread.join(10)
    assert got.version == 1 and got.total_bytes == entry.total_bytes
    assert time.monotonic() - started > 1.5 * 2.0  # it did outlast its timeout


@pytest.mark.parametrize("verify_threads", [4], indirect=True)
def test_chunks_are_checked_on_the_verify_threads_while_later_ones_arrive_and_forwarded_only_once_checked(
        verify_threads):
    """On a node with cores to spare (VERIFY_THREADS > 1) the receiving thread goes on taking in messages while
    the verify threads check the chunks before them; a chunk is forwarded (to relays) only once it and every
    chunk before it have passed. Ordering, not timing: chunk 0's check is held until every other message is in."""
    job = uuid.uuid4().hex
    entry = ChunkedVersion.from_blob(job, 0, os.urandom(8 * 4096 + 100), 4096)
    messages = list(entry.headers())
    real, release, held = chunked.chunk_hash, threading.Event(), []
    chunk_0 = bytes(messages[0][1])

    def first_check_held(data):
        if threading.current_thread().name.startswith("weights-verify") and bytes(data) == chunk_0:
            held.append(True)
            release.wait(30)
        return real(data)

    chunked.chunk_hash = first_check_held
    store = VersionStore(keep_versions=2)
    sender, receiver = socket.socketpair()
    got = []

    def read() -> None:
        try:
            got.extend(i.result for i in tcp.read_versions(receiver, store))
        except (tcp.PeerGone, OSError):
            pass  # the sender closed at the end

    reading = threading.Thread(target=read, daemon=True)
    try:
        reading.start()
        for chunk, data in messages:
            tcp.send_chunk(sender, chunk.SerializeToString(), data)
        deadline = time.monotonic() + 30
        while (job not in store._incoming or store._incoming[job]._received < len(messages)) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        incoming = store._incoming[job]
        assert held and incoming._received == len(messages)  # every message taken in, chunk 0 still checking
        assert incoming.frames == [] and incoming.result is None  # nothing forwarded past an unchecked chunk
        release.set()
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got and got[0].blob == entry.blob and len(incoming.frames) == len(messages)
    finally:
        release.set()
        sender.close()
        reading.join(timeout=10)
        receiver.close()
        chunked.chunk_hash = real


def test_a_publisher_still_sending_after_a_corrupted_chunk_is_told_which_chunk(hub):
    """The hub finds chunk 3 corrupted while the publisher is still sending the rest (on the verify threads, the
    hub shuts its reading side to wake its receiving thread): the publisher reads InvalidArgument naming the chunk
    and its hash, not a reset connection; and the hub keeps serving."""
    job = uuid.uuid4().hex
    entry = ChunkedVersion.from_blob(job, 1, os.urandom(64 * 65536), 65536)

    def corrupted():
        for chunk, data in entry.headers():
            if chunk.index == 3:
                data = bytes([data[0] ^ 1]) + bytes(data[1:])
            yield chunk, data

    for _ in range(5):
        with pytest.raises(errors.InvalidArgument) as err:
            tcp.publish(addr(hub), corrupted(), timeout=30)
        assert err.value.field == "chunk_hash" and "chunk 3" in str(err.value)
    blob = os.urandom(9_000)
    publish(hub, job, 2, blob)
    assert tcp.fetch(addr(hub), pb.FetchRequest(job_id=job, version=2), 10, VersionStore()).blob == blob
