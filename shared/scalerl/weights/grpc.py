"""Weights over the weight-broadcast service's gRPC streams: named tensors travel as one safetensors blob cut
into WeightChunk messages (the wire format is `scalerl.weights.chunked`).

The publisher keeps its last version and sends the next one as a delta when that is smaller. A subscriber asks
the hub where to get chunks (Join) and, unless relaying is off, serves the same Subscribe to its own children
from a small gRPC server inside this client: chunks are forwarded as they arrive, before the generator has
loaded anything, so the generator's code does not know it relays.
"""

from __future__ import annotations

import logging
import socket
import statistics
import threading
import time
import uuid
from concurrent import futures
from typing import Iterator

import grpc

from scalerl import errors
from scalerl.logs import job_logger
from scalerl.serving import GRPC_OPTIONS, call_until_answered, channel
from scalerl.v1 import weight_broadcast_pb2 as pb
from scalerl.v1 import weight_broadcast_pb2_grpc
from scalerl.weights import tcp
from scalerl.weights.base import (CHUNK_BYTES, GrpcWeightTransportConfig, NamedTensors, StagedVersion,
                                  WeightTransport)
from scalerl.weights.chunked import (BufferPool, ChunkedVersion, HashingAhead, Incoming, VersionStore, decode_frame,
                                     stream_frames)
from scalerl.weights.codec import SafetensorsBlob, StagingBuffers

log = logging.getLogger(__name__)

SERVICE = "scalerl.v1.WeightBroadcast"


def _raw(data: bytes) -> bytes:
    return data


def subscribe_method(ch: grpc.Channel):
    """Subscribe whose replies stay raw bytes (forwarded to children exactly as received)."""
    return ch.unary_stream(f"/{SERVICE}/Subscribe", request_serializer=pb.SubscribeRequest.SerializeToString,
                           response_deserializer=_raw)


def receive(frames, store: VersionStore | None = None) -> Iterator[ChunkedVersion]:
    """Raw frames -> whole verified versions, each chunk checked as it arrives. With a store, versions go into
    it as they arrive (children relay them) and a delta is applied to the store's copy of its base."""
    store = store if store is not None else VersionStore(keep_versions=2)
    incoming: Incoming | None = None
    try:
        for raw in frames:
            chunk, data = decode_frame(raw)
            if chunk.seq == 0:
                if incoming is not None and not incoming.done:
                    store.abort(incoming, errors.Unavailable("superseded mid-stream"))
                incoming = store.begin(chunk)
            elif incoming is None or incoming.done:
                raise errors.InvalidArgument(f"weights v{chunk.version}: message {chunk.seq} without its start",
                                             field="seq")
            done = incoming.add(raw, chunk, data)
            if done is not None:
                yield store.complete(incoming)
    except BaseException as err:
        if incoming is not None and not incoming.done:
            store.abort(incoming, err)
        raise


class RelayServer:
    """Serves Subscribe to this subscriber's children from its own store (the hub's code path)."""

    def __init__(self, store: VersionStore, host: str, port: int = 0, poll_s: float = 0.5):
        self.store = store
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="weights-relay"),
                                  options=GRPC_OPTIONS)
        handler = grpc.unary_stream_rpc_method_handler(
            self._subscribe, request_deserializer=pb.SubscribeRequest.FromString, response_serializer=_raw)
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Subscribe": handler}),))
        bound = self.server.add_insecure_port(f"{'[::]' if host not in ('127.0.0.1', 'localhost') else host}:{port}")
        self.addr = f"{host}:{bound}"
        self.poll_s = poll_s
        self.sent_bytes = 0
        self.server.start()

    def _count(self, n: int) -> None:
        self.sent_bytes += n

    def _subscribe(self, request, context):
        yield from stream_frames(self.store, request.job_id, request.have_version, context.is_active,
                                 self.poll_s, sent=self._count)

    def stop(self) -> None:
        self.server.stop(0)


class TcpRelay(tcp.DataServer):
    """The TCP data plane's relay: serves Subscribe to this subscriber's children from its store."""

    def __init__(self, store: VersionStore, host: str, port: int = 0, poll_s: float = 0.5):
        super().__init__(store, _bind_host(host), port, poll_s=poll_s)
        self.addr = f"{host}:{self.port}"


def advertised_host(configured: str) -> str:
    if configured:
        return configured
    try:  # the pod IP in Kubernetes (the hostname resolves to it)
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _bind_host(host: str) -> str:
    return host if host in ("127.0.0.1", "localhost") else "0.0.0.0"


class DeltaChoice:
    """Whether the next publish goes as a delta. `delta: auto` times both ways (publish start to the hub's
    answer) and takes the faster, trying the other again every `probe_every` publishes so that a change of link or
    load is followed. A delta sends a few percent of the bytes, but the learner spends CPU finding the changed
    words and every node patches and hashes each changed chunk whole: it wins on slow links and loses on fast
    ones (docs/benchmarks/weights.md, "Deltas at cluster scale"). What is timed is the learner -> hub hop, whose
    CPU (the hub patching and hashing) is what every relay does too; where the generators' links are much slower
    than the hub's, set `delta: true`."""

    SAMPLES = 3
    """Each way is judged by the median of its last few publishes, so one slow outlier does not stick."""

    def __init__(self, mode: bool | str, probe_every: int = 16):
        self.mode = mode
        self.probe_every = probe_every
        self.job_id = ""
        self.seconds: dict[bool, list[float]] = {}
        """Per way (True: delta), the seconds of its last publishes."""
        self._since_probe = 0

    def use_delta(self, job_id: str) -> bool:
        if self.mode != "auto":
            return bool(self.mode)
        if job_id != self.job_id:  # another job, maybe another model: time both ways again
            self.job_id, self.seconds, self._since_probe = job_id, {}, 0
        if True not in self.seconds or False not in self.seconds:
            return True not in self.seconds  # the way not timed yet, a delta first
        faster = statistics.median(self.seconds[True]) <= statistics.median(self.seconds[False])
        self._since_probe += 1
        if self._since_probe >= self.probe_every:
            self._since_probe = 0
            return not faster
        return faster

    def record(self, delta: bool, seconds: float) -> None:
        """A publish that went the way it was chosen to (a delta that fell back to whole is not timed: it paid
        for both, and maybe for waiting out the hub)."""
        self.seconds.setdefault(delta, []).append(seconds)
        del self.seconds[delta][:-self.SAMPLES]


class GrpcStreamTransport(WeightTransport):
    LOOKUP_TIMEOUT_S = 30.0
    """Deadline of one ask for the hub's data port (its gRPC GetLatest, which waits for the hub to be up)."""
    hash_ahead = True
    """Whole versions over TCP are hashed by a helper thread as they are sent (`HashingAhead`); False: hashed
    whole first (the bench compares the two side by side)."""

    def __init__(self, addr: str, *, chunk_bytes: int = CHUNK_BYTES, timeout_s: float = 300.0,
                 delta: bool | str = "auto",
                 relay: bool = True, relay_host: str = "", relay_port: int = 0, data_plane: str = "tcp"):
        if not addr:
            raise errors.InvalidArgument("the weight-broadcast address is empty", field="weight_transport.addr")
        self.addr = addr
        self.data_plane = data_plane
        self._data_addr: str | None = None
        self._fetch_buffers = BufferPool(max_buffers=3)
        """Receive buffers of `fetch` (the TCP plane), reused from one fetch to the next."""
        self.chunk_bytes = chunk_bytes
        self.timeout_s = timeout_s
        self.delta = DeltaChoice(delta)
        self.relay = relay
        self.relay_host = relay_host
        self.relay_port = relay_port
        self._channel = channel(addr)
        self._stub = weight_broadcast_pb2_grpc.WeightBroadcastStub(self._channel)
        self._publish = self._channel.stream_unary(f"/{SERVICE}/Publish", request_serializer=_raw,
                                                   response_deserializer=pb.PublishResponse.FromString)
        self._last: ChunkedVersion | None = None
        self._staging = StagingBuffers()
        self._publishing = threading.RLock()
        """One publish at a time (the training loop and the validation thread both publish): each reads the
        delta base that the one before it left."""
        self.subscriber_id = uuid.uuid4().hex[:12]
        self.last_publish_bytes = 0
        """Bytes the last publish sent (a delta sends fewer than the version's size)."""
        self.relays: list[RelayServer] = []

    @classmethod
    def from_config(cls, config: GrpcWeightTransportConfig) -> "GrpcStreamTransport":
        return cls(config.addr, chunk_bytes=config.chunk_bytes, timeout_s=config.timeout_s, delta=config.delta,
                   relay=config.relay, relay_host=config.relay_host, relay_port=config.relay_port,
                   data_plane=config.data_plane)

    # ---- the TCP data plane ----------------------------------------------------------------------------------
    def hub_data_addr(self, refresh: bool = False, timeout: float | None = None) -> str:
        """host:port of the hub's TCP data plane: the hub's host (its Service in Kubernetes), the port it reports."""
        if self._data_addr is None or refresh:
            info = self._stub.GetLatest(pb.GetLatestRequest(job_id=""),
                                        timeout=self.LOOKUP_TIMEOUT_S if timeout is None else timeout)
            if not info.data_port:
                raise errors.FailedPrecondition("the weight-broadcast hub serves no TCP data plane",
                                                field="weight_transport.data_plane")
            self._data_addr = f"{tcp.split_addr(self.addr)[0]}:{info.data_port}"
        return self._data_addr

    def _data_addr_within(self, timeout: float) -> str:
        """`hub_data_addr` asked within `timeout` (at most LOOKUP_TIMEOUT_S); a hub that does not answer in time
        is away (PeerGone, retried), not a failed call."""
        timeout = min(timeout, self.LOOKUP_TIMEOUT_S)
        try:
            return self.hub_data_addr(timeout=timeout)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
            raise tcp.PeerGone(f"the hub did not tell its data port within {timeout:.0f} s") from None

    def _to_hub(self, call, what: str):
        """`call(data addr, timeout)`, again with backoff within the deadline while the hub is away (restarting:
        its data port may have changed, so it is asked again)."""

        def again(err: BaseException) -> None:
            self._data_addr = None
            log.warning("%s: the hub is unavailable (%s); trying again", what, err)

        return call_until_answered(lambda timeout: call(self._data_addr_within(timeout), timeout),
                                   deadline_s=self.timeout_s, retryable={grpc.StatusCode.UNAVAILABLE},
                                   retry_errors=(tcp.PeerGone,),
                                   attempt_timeout=lambda left: max(1.0, left), on_retry=again)

    # ---- learner side ----------------------------------------------------------------------------------------
    def stage(self, job_id: str, version: int, tensors: NamedTensors, pinned: bool = False) -> StagedVersion:
        with self._publishing:
            last = self._last  # the base of the next delta: its buffer is not reused for this version
            blob, release = self._staging.lease(tensors, keep=last.parts[0] if last is not None else None)
        return StagedVersion(lambda: self.publish_bytes(job_id, version, blob, pinned=pinned), release=release)

    def publish_bytes(self, job_id: str, version: int, blob: bytes, pinned: bool = False) -> None:
        """The wire level: publish an already-encoded blob (tests and benchmarks of the service)."""
        with self._publishing:
            start = time.monotonic()
            last = self._last
            has_base = last is not None and last.job_id == job_id and version > last.version
            delta = has_base and self.delta.use_delta(job_id)
            if delta or self.data_plane != "tcp" or not self.hash_ahead:
                entry = ChunkedVersion.from_blob(job_id, version, blob, self.chunk_bytes)
            else:  # whole, over TCP: the first chunk leaves while the rest is still being hashed
                entry = HashingAhead(job_id, version, blob, self.chunk_bytes)
            sent_as_delta = self._publish_entry(entry, last if delta else None, pinned)
            self.last_publish_sent_as = "delta" if sent_as_delta else "whole"
            if has_base and sent_as_delta == delta:
                self.delta.record(delta, time.monotonic() - start)

    def _publish_entry(self, entry: ChunkedVersion | HashingAhead, base: ChunkedVersion | None, pinned: bool
                       ) -> bool:
        """Send `entry`, as a delta on `base` when there is one and that works; whether it went as a delta."""
        job_id, version = entry.job_id, entry.version
        last = self._last
        if self.data_plane == "tcp":
            sent_as_delta = self._publish_tcp(entry, base, pinned)
            if last is None or version > last.version or last.job_id != job_id:
                self._last = entry.result()
            return sent_as_delta
        frames = None
        if base is not None:
            frames = entry.delta_frames(base, pinned=pinned)
        if frames is not None:
            try:
                self._publish(iter(frames), timeout=self.timeout_s)
            except grpc.RpcError as err:
                if err.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
                    raise
                # NOT_FOUND: the hub lost the base (restarted); UNAVAILABLE: it went away mid-stream and may come
                # back without it. Either way the version goes whole.
                frames = None
        if frames is None:
            sent = 0

            def counted():  # built as they go (one copy per chunk), not all at once
                nonlocal sent
                sent = 0
                for frame in entry.frames(pinned=pinned):
                    sent += len(frame)
                    yield frame

            # a streamed publish is not retried by the channel: the hub restarting is waited out
            call_until_answered(
                lambda timeout: self._publish(counted(), timeout=timeout), deadline_s=self.timeout_s,
                retryable={grpc.StatusCode.UNAVAILABLE}, attempt_timeout=lambda left: max(1.0, left),
                on_retry=lambda err: log.warning("weights v%d: the hub is unavailable (%s); publishing again",
                                                 version, err.details()))
            self.last_publish_bytes = sent
        else:
            self.last_publish_bytes = sum(len(f) for f in frames)
        if last is None or version > last.version or last.job_id != job_id:
            self._last = entry
        return frames is not None

    def _publish_tcp(self, entry: ChunkedVersion | HashingAhead, base: ChunkedVersion | None, pinned: bool) -> bool:
        delta = entry.result().delta_headers(base, pinned=pinned) if base is not None else None
        if delta is not None:
            try:
                tcp.publish(self._data_addr_within(self.timeout_s), delta, self.timeout_s)
                self.last_publish_bytes = sum(len(d) for _, d in delta)
                return True
            except (errors.NotFound, tcp.PeerGone, grpc.RpcError):
                pass  # the hub lost the base (restarted) or is away: the version goes whole, retried
        self._to_hub(lambda addr, timeout: tcp.publish(addr, entry.headers(pinned), timeout),
                     f"weights v{entry.version}")
        self.last_publish_bytes = entry.total_bytes
        return False

    # ---- generator side --------------------------------------------------------------------------------------
    def subscribe(self, job_id: str, have_version: int, stop: threading.Event) -> Iterator[SafetensorsBlob]:
        """A receiving thread keeps this client's store current (and relays from it); this yields the newest
        whole version past `have_version` each time one lands, skipping any the consumer was too slow for."""
        store = VersionStore(keep_versions=2)
        relay = None
        if self.relay:
            host = advertised_host(self.relay_host)
            relay = (RelayServer(store, host, self.relay_port) if self.data_plane == "grpc" else
                     TcpRelay(store, host, self.relay_port))
            self.relays.append(relay)
        done = threading.Event()
        thread = threading.Thread(target=self._receive_loop, args=(job_id, store, relay, stop, done), daemon=True,
                                  name="weights-receive")
        thread.start()
        try:
            while not stop.is_set() and not done.is_set():
                entry = store.wait_complete(job_id, have_version, timeout=0.2)
                if entry is not None:
                    have_version = entry.version
                    yield SafetensorsBlob(job_id, entry.version, entry.blob)
        finally:
            done.set()
            thread.join(timeout=5)
            if relay is not None:
                relay.stop()
                self.relays.remove(relay)

    def _receive_loop(self, job_id: str, store: VersionStore, relay: RelayServer | None, stop: threading.Event,
                      done: threading.Event) -> None:
        jlog = job_logger(log, job_id)
        failed_parent, hub_gone = "", False
        while not (stop.is_set() or done.is_set()):
            parent_channel, parent = None, ""
            try:
                joined = self._stub.Join(pb.JoinRequest(job_id=job_id, subscriber_id=self.subscriber_id,
                                                        relay_addr=relay.addr if relay else "",
                                                        failed_parent=failed_parent), timeout=30)
                parent = joined.parent_addr
                latest = store.latest(job_id)
                request = pb.SubscribeRequest(job_id=job_id, subscriber_id=self.subscriber_id,
                                              have_version=latest.version if latest else -1)
                if self.data_plane == "tcp":
                    sock = tcp.subscribe(parent or self.hub_data_addr(refresh=hub_gone), request)
                    hub_gone = False
                    threading.Thread(target=self._close_when, args=(sock, stop, done), daemon=True).start()
                    with sock:
                        for _ in tcp.read_versions(sock, store):
                            pass
                    raise tcp.PeerGone("the stream ended")
                if parent:
                    # no wait-for-ready: a dead peer must fail fast so the hub can place us elsewhere
                    parent_channel = grpc.insecure_channel(parent, options=GRPC_OPTIONS)
                    method = subscribe_method(parent_channel)
                else:
                    method = subscribe_method(self._channel)
                call = method(request)
                watcher = threading.Thread(target=self._cancel_when, args=(call, stop, done), daemon=True)
                watcher.start()
                for _ in receive(call, store):
                    pass
                failed_parent = ""
            except (grpc.RpcError, tcp.PeerGone, OSError) as err:
                if stop.is_set() or done.is_set():
                    return
                # only an unreachable peer leaves the tree (a broken upload upstream is not its fault)
                code = err.code() if isinstance(err, grpc.RpcError) else None
                gone = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED) or code is None
                failed_parent = parent if gone else ""
                hub_gone = gone and not parent
                jlog.warning("weight subscription broke (%s%s); joining again",
                             code.name if code is not None else err,
                             f" at relay {failed_parent}" if failed_parent else "")
                stop.wait(0.2 if failed_parent else 1.0)
            except Exception as err:  # a corrupt or incomplete version (or unparsable bytes): dropped
                failed_parent = parent  # a peer that sends corrupt bytes leaves the tree
                jlog.warning("weights rejected (%s: %s); subscribing again", type(err).__name__, err)
                stop.wait(0.2)
            finally:
                if parent_channel is not None:
                    parent_channel.close()

    @staticmethod
    def _cancel_when(call, stop: threading.Event, done: threading.Event) -> None:
        while not (stop.wait(0.2) or done.is_set()):
            if not call.is_active():
                return
        call.cancel()

    @staticmethod
    def _close_when(sock: socket.socket, stop: threading.Event, done: threading.Event) -> None:
        while not (stop.wait(0.2) or done.is_set()):
            if sock.fileno() < 0:
                return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def fetch(self, job_id: str, version: int, release: bool = False) -> SafetensorsBlob:
        if self.data_plane == "tcp":
            request = pb.FetchRequest(job_id=job_id, version=version, release=release)
            # a store per fetch (concurrent fetches of one version must not see each other), buffers shared
            entry = self._to_hub(lambda addr, timeout: tcp.fetch(
                addr, request, timeout, VersionStore(keep_versions=1, pool=self._fetch_buffers)), f"weights v{version}")
            return SafetensorsBlob(job_id, entry.version, entry.blob)
        call = self._channel.unary_stream(f"/{SERVICE}/Fetch", request_serializer=pb.FetchRequest.SerializeToString,
                                          response_deserializer=_raw)(
            pb.FetchRequest(job_id=job_id, version=version, release=release), timeout=self.timeout_s)
        for entry in receive(call):
            return SafetensorsBlob(job_id, entry.version, entry.blob)
        raise RuntimeError(f"weights v{version}: empty fetch")

    def latest_version(self, job_id: str) -> int:
        return self._stub.GetLatest(pb.GetLatestRequest(job_id=job_id), timeout=10).version

    def close(self) -> None:
        self._channel.close()
