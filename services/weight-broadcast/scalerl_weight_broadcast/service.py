"""WeightBroadcast gRPC servicer (thin): the learner uploads a version once as chunks; each chunk is verified
and relayed to subscribers as it arrives (`scalerl.weights.chunked`), and subscribers are placed in a relay tree
(`tree.RelayTree`) so the hub streams to a bounded number of them. Errors are scalerl.errors, mapped to status
codes by the bootstrap's interceptor."""

from __future__ import annotations

import logging

import grpc

from scalerl import errors
from scalerl.logs import job_logger
from scalerl.v1 import weight_broadcast_pb2, weight_broadcast_pb2_grpc
from scalerl.weights.chunked import Incoming, VersionStore, decode_frame, grpc_frame, message_size, stream_frames
from scalerl.weights.tcp import DataServer
from scalerl_weight_broadcast import metrics
from scalerl_weight_broadcast.tree import RelayTree

log = logging.getLogger(__name__)

CGROUP_MEMORY_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def memory_limit_bytes(paths=CGROUP_MEMORY_LIMITS) -> int | None:
    """This container's memory limit (cgroup v2, then v1); None when unlimited or unknown."""
    for path in paths:
        try:
            raw = open(path).read().strip()
        except OSError:
            continue
        if raw.isdigit() and int(raw) < 1 << 60:  # v1 writes a huge number for "no limit", v2 writes "max"
            return int(raw)
        return None
    return None


def _raw(data: bytes) -> bytes:
    return data


def add_to_server(service: "WeightBroadcastService", server: grpc.Server) -> None:
    """Register the service: chunks are kept as the bytes received and streamed on as they are."""
    pb = weight_broadcast_pb2
    handlers = {
        "Publish": grpc.stream_unary_rpc_method_handler(
            service.Publish, request_deserializer=_raw, response_serializer=pb.PublishResponse.SerializeToString),
        "Subscribe": grpc.unary_stream_rpc_method_handler(
            service.Subscribe, request_deserializer=pb.SubscribeRequest.FromString, response_serializer=_raw),
        "Fetch": grpc.unary_stream_rpc_method_handler(
            service.Fetch, request_deserializer=pb.FetchRequest.FromString, response_serializer=_raw),
        "GetLatest": grpc.unary_unary_rpc_method_handler(
            service.GetLatest, request_deserializer=pb.GetLatestRequest.FromString,
            response_serializer=pb.VersionInfo.SerializeToString),
        "Join": grpc.unary_unary_rpc_method_handler(
            service.Join, request_deserializer=pb.JoinRequest.FromString,
            response_serializer=pb.JoinResponse.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("scalerl.v1.WeightBroadcast", handlers),))


class WeightBroadcastService(weight_broadcast_pb2_grpc.WeightBroadcastServicer):
    def __init__(self, store: VersionStore | None = None, poll_s: float = 1.0, relay_fanout: int = 2):
        self.store = store or VersionStore()
        self.poll_s = poll_s
        self.tree = RelayTree(relay_fanout)
        self._subscribers: dict[str, int] = {}
        self._absent_once: set[str] = set()
        self.memory_limit = memory_limit_bytes()
        self._warned_memory: set[str] = set()
        self.data: DataServer | None = None
        """The raw TCP data plane serving the same store (`serve_data`); GetLatest tells clients its port."""

    def serve_data(self, host: str = "0.0.0.0", port: int = 0) -> DataServer:
        """Open the TCP data plane: Publish, Subscribe and Fetch of `data_plane: tcp` clients."""
        self.data = DataServer(self.store, host, port, poll_s=self.poll_s, on_published=self.published,
                               sent=lambda job_id: metrics.SENT_BYTES.labels(job_id).inc,
                               on_subscription=lambda job_id, n: metrics.SUBSCRIBERS.labels(job_id).inc(n))
        return self.data

    def keep_only(self, active_job_id: str | None) -> None:
        """Drop every job but the active one: its versions (a real model's are GBs each), relay tree and series.
        Runs on each answer of the control plane; a job is dropped when two answers in a row do not name it (a
        job that started between an answer and this call is named by the next one)."""
        absent = (self.store.job_ids() | metrics.jobs()) - {active_job_id}
        ended, self._absent_once = absent & self._absent_once, absent - self._absent_once
        for job_id in ended:
            self.store.drop_job(job_id)
            self.tree.drop_job(job_id)
            metrics.forget_job(job_id)
            log.info("dropped the versions of ended job %s", job_id)

    def Publish(self, request_iterator, context):
        incoming = None
        try:
            for raw in request_iterator:
                chunk, data = decode_frame(raw)
                if incoming is None:
                    incoming = self.store.begin(chunk)
                incoming.add(raw, chunk, data)
            if incoming is None:
                raise errors.InvalidArgument("no chunks sent")
            if incoming.result is None:
                raise errors.InvalidArgument(f"got {len(incoming.frames)} messages, expected {incoming.messages}",
                                             field="messages", job_id=incoming.job_id)
        except BaseException as err:
            if incoming is not None:
                self.store.abort(incoming, err)
            raise
        entry = self.store.complete(incoming)
        self.published(incoming)
        return weight_broadcast_pb2.PublishResponse(version=entry.version, total_bytes=entry.total_bytes)

    def published(self, incoming: Incoming) -> None:
        """A version is in the store (over gRPC or the TCP data plane): gauges and the log."""
        entry = incoming.result
        latest = self.store.latest(entry.job_id)
        metrics.VERSION.labels(entry.job_id).set(latest.version if latest else entry.version)  # a re-pin is older
        self._check_memory(entry.job_id, entry.total_bytes)
        received = sum(message_size(f) for f in incoming.frames)
        metrics.PUBLISHED_BYTES.labels(entry.job_id).inc(received)
        job_logger(log, entry.job_id).info("version published (%d bytes, %d received%s)", entry.total_bytes,
                                           received, "" if incoming.base_version is None else
                                           f", delta on v{incoming.base_version}", extra={"version": entry.version})

    def _check_memory(self, job_id: str, version_bytes: int) -> None:
        """Warn once per job when the versions the hub will hold cannot fit its memory limit (an 8B bf16 policy is
        16 GB a version): better a log line naming the knobs now than an OOM kill mid-run."""
        needed = (self.store.keep_versions + 2) * version_bytes
        if self.memory_limit is None or needed <= 0.9 * self.memory_limit or job_id in self._warned_memory:
            return
        self._warned_memory.add(job_id)
        job_logger(log, job_id).warning(
            "this hub will hold up to %d versions of %.2f GB (%.1f GB, pinned ones not counted) against a memory "
            "limit of %.1f GB: lower weightTransport.grpc.hubKeepVersions (now %d) or raise "
            "weightBroadcast.resources.limits.memory", self.store.keep_versions + 2, version_bytes / 1e9,
            needed / 1e9, self.memory_limit / 1e9, self.store.keep_versions)

    def Subscribe(self, request, context):
        if not request.job_id:
            raise errors.InvalidArgument("is required", field="job_id")
        sent = metrics.SENT_BYTES.labels(request.job_id)
        metrics.SUBSCRIBERS.labels(request.job_id).inc()
        try:
            yield from stream_frames(self.store, request.job_id, request.have_version, context.is_active,
                                     self.poll_s, sent=sent.inc)
        finally:
            metrics.SUBSCRIBERS.labels(request.job_id).dec()

    def Fetch(self, request, context):
        entry = self.store.require(request.job_id, request.version, release=request.release)
        frames = entry.full_frames()
        if self.store.latest(entry.job_id) is not entry:
            entry.drop_frames()  # only the latest keeps its serialized frames
        for frame in frames:
            yield grpc_frame(frame)  # one that came over the TCP data plane is framed here

    def GetLatest(self, request, context):
        entry = self.store.latest(request.job_id)
        data_port = self.data.port if self.data is not None else 0
        if entry is None:
            return weight_broadcast_pb2.VersionInfo(job_id=request.job_id, version=-1, data_port=data_port)
        return weight_broadcast_pb2.VersionInfo(job_id=entry.job_id, version=entry.version, digest=entry.digest.hex(),
                                                total_bytes=entry.total_bytes,
                                                subscribers=self.tree.members(request.job_id), data_port=data_port)

    def Join(self, request, context):
        if not request.job_id:
            raise errors.InvalidArgument("is required", field="job_id")
        parent, depth = self.tree.join(request.job_id, request.subscriber_id, request.relay_addr,
                                       request.failed_parent)
        metrics.RELAY_MEMBERS.labels(request.job_id).set(self.tree.members(request.job_id))
        return weight_broadcast_pb2.JoinResponse(parent_addr=parent, depth=depth)
