"""The raw TCP data plane of the weight-broadcast transport: the same chunks, hashes, deltas and relay tree as the
gRPC streams, carried over plain sockets so a hop runs near a socket copy (gRPC Python alone reaches ~0.3 of one;
docs/benchmarks/weights.md). gRPC keeps the control calls (Join, GetLatest); Publish, Subscribe and Fetch move here
when `data_plane: tcp`.

A receiver takes each whole chunk straight into its slot of the version's buffer (`Incoming.slot`; buffers are
reused across versions), checks its hash there, and a relay forwards it from there: no copy in Python on any hop.

Wire (little-endian). The client opens with `MAGIC`, one op byte and a u32-length protobuf request
(SubscribeRequest for S, FetchRequest for F, nothing for P). Then records, each `kind u8, a u32, b u32`:
  C  a chunk: `a` bytes of WeightChunk header (its data unset), then `b` bytes of data;
  E  an error: `a` bytes of JSON {code, message, field}; the stream ends;
  K  a Publish's answer: `a` bytes of PublishResponse.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from scalerl import errors
from scalerl.v1 import weight_broadcast_pb2 as pb
from scalerl.weights.chunked import ChunkedVersion, Incoming, VersionStore, stream_frames

log = logging.getLogger(__name__)

MAGIC = b"SRW1"
_RECORD = struct.Struct("<cII")
MAX_HEADER_BYTES = 1 << 16
MAX_DATA_BYTES = 256 << 20
"""Bound on one record's data (a chunk is at most 64 MiB; a sparse patch at most 3x its chunk)."""
_SOCKET_BUFFER = 4 << 20

OP_PUBLISH, OP_SUBSCRIBE, OP_FETCH = b"P", b"S", b"F"
_ERRORS = {cls.__name__: cls for cls in (errors.InvalidArgument, errors.NotFound, errors.FailedPrecondition,
                                         errors.ResourceExhausted, errors.Unavailable, errors.AlreadyExists)}


class PeerGone(errors.Unavailable, ConnectionError):
    """The other end closed or reset the connection (a retry, or another parent, may do)."""

    def __init__(self, message: str):
        super().__init__(message)


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # a peer whose node vanished sends no FIN: keepalive ends the stream in ~30 s so its children rejoin elsewhere
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 15)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER)


def connect(addr: str, timeout: float | None) -> socket.socket:
    try:
        sock = socket.create_connection(split_addr(addr), timeout=min(timeout or 10.0, 10.0))
    except OSError as err:
        raise PeerGone(f"cannot reach {addr}: {err}") from None
    sock.settimeout(timeout)
    _tune(sock)
    return sock


# ------------------------------------------------------------------------------------------------ records
def _recv_into(sock: socket.socket, view: memoryview) -> None:
    got, n = 0, len(view)
    while got < n:
        r = sock.recv_into(view[got:], n - got)
        if not r:
            raise PeerGone("connection closed mid-record")
        got += r


def _recv(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    _recv_into(sock, memoryview(buf))
    return buf


def send_chunk(sock: socket.socket, header: bytes, data) -> None:
    sock.sendall(_RECORD.pack(b"C", len(header), len(data)) + header)
    if len(data):
        sock.sendall(data)


def send_error(sock: socket.socket, err: BaseException) -> None:
    if isinstance(err, errors.ScaleRLError):
        body = {"code": type(err).__name__, "message": Exception.__str__(err), "field": err.field}
    else:
        body = {"code": "Unavailable", "message": f"{type(err).__name__}: {err}", "field": None}
    raw = json.dumps(body).encode()
    try:
        sock.sendall(_RECORD.pack(b"E", len(raw), 0) + raw)
    except OSError:
        pass


def _raise_error(raw: bytes) -> None:
    body = json.loads(raw)
    cls = _ERRORS.get(body.get("code"), errors.Unavailable)
    field = body.get("field")
    message = body.get("message", "")
    if field and message.startswith(f"{field}: "):
        message = message[len(field) + 2:]
    raise cls(message, field=field)


def read_versions(sock: socket.socket, store: VersionStore) -> Iterator[Incoming]:
    """Records -> whole verified versions in `store` (as `grpc.receive` does for gRPC frames), each yielded as
    the completed Incoming (`result` is the version; the hub's publish hook reads what was received): each whole
    chunk is received into its slot of the version's buffer and checked there; children relay from the store."""
    incoming: Incoming | None = None
    head = bytearray(_RECORD.size)
    try:
        while True:
            _recv_into(sock, memoryview(head))
            kind, a, b = _RECORD.unpack(head)
            if kind == b"E":
                _raise_error(_recv(sock, min(a, MAX_HEADER_BYTES)))
            if kind != b"C":
                raise errors.InvalidArgument(f"unexpected record {kind!r}", field="chunk")
            if a > MAX_HEADER_BYTES or b > MAX_DATA_BYTES:
                raise errors.ResourceExhausted(f"a record of {a} + {b} bytes is over the limit", field="data")
            header_bytes = bytes(_recv(sock, a))
            chunk = pb.WeightChunk.FromString(header_bytes)
            if chunk.seq == 0:
                if incoming is not None and not incoming.done:
                    store.abort(incoming, errors.Unavailable("superseded mid-stream"))
                incoming = store.begin(chunk, contiguous=True)
                incoming.wake_on_failure = lambda: sock.shutdown(socket.SHUT_RD)
            elif incoming is None or incoming.done:
                raise errors.InvalidArgument(f"weights v{chunk.version}: message {chunk.seq} without its start",
                                             field="seq")
            slot = incoming.slot(chunk)
            data = slot if slot is not None and len(slot) == b else memoryview(_recv(sock, b))
            if data is slot:
                _recv_into(sock, slot)
            if incoming.add((header_bytes, data), chunk, data) is not None:
                store.complete(incoming)
                yield incoming
    except BaseException as err:
        failed = incoming.failed_check if incoming is not None else None
        if incoming is not None and not incoming.done:
            store.abort(incoming, failed or err)
        if failed is not None and isinstance(err, (PeerGone, OSError)):  # shut to wake us: the check's error is why
            raise failed from None
        raise


# ------------------------------------------------------------------------------------------------ client
def _open(addr: str, op: bytes, request: bytes, timeout: float | None) -> socket.socket:
    sock = connect(addr, timeout)
    try:
        sock.sendall(MAGIC + op + struct.pack("<I", len(request)) + request)
    except OSError as err:
        sock.close()
        raise PeerGone(f"{addr}: {err}") from None
    return sock


ANSWER_CHECK_S = 0.5
"""How often a publish in progress looks whether the hub has answered (an error) or closed."""


def _stop_sending_once_the_hub_speaks(sock: socket.socket, done: threading.Event) -> None:
    """The hub says nothing during a publish until it has read it all: anything readable before that is an error
    record or its end closing. Then the send is woken (shut for writing) so the answer is read at once. A hub shut
    down mid-publish can close its end with its receive window at zero and never reset it, which would otherwise
    leave `sendall` blocked until its timeout."""
    try:
        while not done.is_set():
            readable, _, _ = select.select([sock], [], [], ANSWER_CHECK_S)
            if readable and not done.is_set():
                sock.shutdown(socket.SHUT_WR)
                return
    except (OSError, ValueError):
        pass  # closed meanwhile: the publish is over


def publish(addr: str, messages: Iterable[tuple[pb.WeightChunk, object]], timeout: float | None
            ) -> pb.PublishResponse:
    """Send one version's messages (header, data) to the hub; its answer, or the error it gave."""
    sock = _open(addr, OP_PUBLISH, b"", timeout)
    sent = threading.Event()
    with sock:
        threading.Thread(target=_stop_sending_once_the_hub_speaks, args=(sock, sent), daemon=True,
                         name="weights-publish-watch").start()
        try:
            for header, data in messages:
                send_chunk(sock, header.SerializeToString(), data)
        except OSError:
            pass  # the hub refused or went away midway: its error record, or the closed connection, says which
        finally:
            sent.set()
        try:
            head = bytearray(_RECORD.size)
            _recv_into(sock, memoryview(head))
            kind, a, _ = _RECORD.unpack(head)
            body = bytes(_recv(sock, min(a, MAX_HEADER_BYTES)))
        except (OSError, PeerGone) as err:
            raise PeerGone(f"{addr}: publish broke off ({err})") from None
        if kind == b"E":
            _raise_error(body)
        return pb.PublishResponse.FromString(body)


def subscribe(addr: str, request: pb.SubscribeRequest) -> socket.socket:
    return _open(addr, OP_SUBSCRIBE, request.SerializeToString(), None)


def fetch(addr: str, request: pb.FetchRequest, timeout: float, store: VersionStore) -> ChunkedVersion:
    """One version, received into `store` (the caller's, so its buffers are reused from fetch to fetch)."""
    sock = _open(addr, OP_FETCH, request.SerializeToString(), timeout)
    with sock:
        try:
            for incoming in read_versions(sock, store):
                return incoming.result
        except OSError as err:
            raise PeerGone(f"{addr}: fetch broke off ({err})") from None
    raise PeerGone(f"{addr}: fetch of v{request.version} ended empty")


# ------------------------------------------------------------------------------------------------ server
class DataServer:
    """Serves the data plane from a store: Subscribe and Fetch everywhere; Publish at the hub (`on_published`
    set). One thread per connection (a subscription is a long-lived stream)."""

    def __init__(self, store: VersionStore, host: str = "127.0.0.1", port: int = 0, poll_s: float = 0.5,
                 on_published: Callable[[Incoming], None] | None = None,
                 sent: Callable[[str], Callable[[int], None]] | None = None,
                 on_subscription: Callable[[str, int], None] | None = None):
        self.store = store
        self.poll_s = poll_s
        self.on_published = on_published
        self.sent_for = sent
        self.on_subscription = on_subscription
        self.sent_bytes = 0
        self._listener = socket.create_server((host, port), backlog=128,
                                              family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.port = self._listener.getsockname()[1]
        self._stopped = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True, name="weights-data")
        self._thread.start()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            _tune(conn)
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True, name="weights-data-conn").start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(30)
            start = _recv(conn, len(MAGIC) + 5)
            if bytes(start[:4]) != MAGIC:
                raise errors.InvalidArgument("not a weights data-plane request", field="magic")
            op, n = bytes(start[4:5]), struct.unpack("<I", start[5:])[0]
            if n > MAX_HEADER_BYTES:
                raise errors.ResourceExhausted(f"a request of {n} bytes is over the limit", field="request")
            request = bytes(_recv(conn, n))
            if op == OP_SUBSCRIBE:
                conn.settimeout(None)
                self._subscribe(conn, pb.SubscribeRequest.FromString(request))
            elif op == OP_FETCH:
                self._fetch(conn, pb.FetchRequest.FromString(request))
            elif op == OP_PUBLISH and self.on_published is not None:
                conn.settimeout(300)
                self._publish(conn)
            else:
                raise errors.InvalidArgument(f"unknown op {op!r}", field="op")
        except (PeerGone, BrokenPipeError, ConnectionResetError):
            pass
        except Exception as err:
            if not isinstance(err, errors.ScaleRLError):
                log.warning("weights data plane: %s: %s", type(err).__name__, err)
            send_error(conn, err)
            _drain(conn)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _count(self, job_id: str) -> Callable[[int], None]:
        extra = self.sent_for(job_id) if self.sent_for is not None else None

        def count(n: int) -> None:
            self.sent_bytes += n
            if extra is not None:
                extra(n)
        return count

    def _subscribe(self, conn: socket.socket, request: pb.SubscribeRequest) -> None:
        if not request.job_id:
            raise errors.InvalidArgument("is required", field="job_id")
        if self.on_subscription is not None:
            self.on_subscription(request.job_id, 1)
        try:
            for header, data in stream_frames(self.store, request.job_id, request.have_version,
                                              lambda: _open_and_quiet(conn) and not self._stopped.is_set(),
                                              self.poll_s, sent=self._count(request.job_id), wire="tcp"):
                self.send(conn, header, data)
        finally:
            if self.on_subscription is not None:
                self.on_subscription(request.job_id, -1)

    def send(self, conn: socket.socket, header: bytes, data) -> None:
        send_chunk(conn, header, data)

    def _fetch(self, conn: socket.socket, request: pb.FetchRequest) -> None:
        entry = self.store.require(request.job_id, request.version, release=request.release)
        for header, data in entry.tcp_messages():
            self.send(conn, header, data)

    def _publish(self, conn: socket.socket) -> None:
        incoming = next(read_versions(conn, self.store), None)
        if incoming is None:
            raise errors.InvalidArgument("no chunks sent")
        self.on_published(incoming)
        entry = incoming.result
        raw = pb.PublishResponse(version=entry.version, total_bytes=entry.total_bytes).SerializeToString()
        conn.sendall(_RECORD.pack(b"K", len(raw), 0) + raw)

    def stop(self) -> None:
        self._stopped.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


DRAIN_QUIET_S = 0.3
"""After an error record, how long nothing more must come before the connection is closed."""


def _drain(conn: socket.socket, limit_s: float = 5.0) -> None:
    """After an error record: read what the peer still sends (a refused publish keeps sending until it looks), so
    closing does not reset the connection before the peer has read why."""
    deadline = time.monotonic() + limit_s
    try:
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(limit_s)
        sink = bytearray(1 << 20)
        quiet_since = None
        while time.monotonic() < deadline:
            if conn.recv_into(sink):
                quiet_since = None
                continue
            # The peer closed, or reading was shut here to wake the receiver (a failed chunk check): then what the
            # peer still sends can be read, but an empty read says nothing, so wait until nothing comes for a while.
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= DRAIN_QUIET_S:
                return
            time.sleep(0.02)
    except OSError:
        pass


def _open_and_quiet(conn: socket.socket) -> bool:
    """A subscriber sends nothing after its request: readable means it closed (or broke the protocol)."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable
