"""WeightBroadcast gRPC service: the learner uploads a version once, every subscriber gets it streamed."""

from __future__ import annotations

import hashlib
import logging

import grpc
from prometheus_client import Counter, Gauge

from scalerl.v1 import weight_broadcast_pb2, weight_broadcast_pb2_grpc
from scalerl_weights.store import ChecksumMismatch, VersionStore, WeightVersion

log = logging.getLogger(__name__)

# gRPC Python moves 64 MiB ~7x faster as 256 KiB messages than as 4 MiB ones (bench/weights_bench.py).
CHUNK_BYTES = 256 * 1024
VERSION = Gauge("scalerl_weights_version", "Latest published policy version", ["job_id"])
PUBLISHED_BYTES = Counter("scalerl_weights_published_bytes_total", "Bytes published by the learner", ["job_id"])
SENT_BYTES = Counter("scalerl_weights_sent_bytes_total", "Bytes streamed to subscribers", ["job_id"])
SUBSCRIBERS = Gauge("scalerl_weights_subscribers", "Open subscriptions", ["job_id"])


def frames_of(entry: WeightVersion, chunk_bytes: int | None = None) -> tuple[bytes, ...]:
    """The version's chunks serialized once; sent as-is to every subscriber (see `add_to_server`)."""
    return tuple(chunk.SerializeToString() for chunk in chunks_of(entry, chunk_bytes))


def _serialize_chunk(chunk) -> bytes:
    return chunk if isinstance(chunk, bytes) else chunk.SerializeToString()


def add_to_server(service: "WeightBroadcastService", server: grpc.Server) -> None:
    """Register the service; Subscribe and Fetch may yield pre-serialized WeightChunk bytes."""
    handlers = {
        "Publish": grpc.stream_unary_rpc_method_handler(
            service.Publish, request_deserializer=weight_broadcast_pb2.WeightChunk.FromString,
            response_serializer=weight_broadcast_pb2.PublishResponse.SerializeToString),
        "Subscribe": grpc.unary_stream_rpc_method_handler(
            service.Subscribe, request_deserializer=weight_broadcast_pb2.SubscribeRequest.FromString,
            response_serializer=_serialize_chunk),
        "Fetch": grpc.unary_stream_rpc_method_handler(
            service.Fetch, request_deserializer=weight_broadcast_pb2.FetchRequest.FromString,
            response_serializer=_serialize_chunk),
        "GetLatest": grpc.unary_unary_rpc_method_handler(
            service.GetLatest, request_deserializer=weight_broadcast_pb2.GetLatestRequest.FromString,
            response_serializer=weight_broadcast_pb2.VersionInfo.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("scalerl.v1.WeightBroadcast", handlers),))


def chunks_of(entry: WeightVersion, chunk_bytes: int | None = None):
    chunk_bytes = chunk_bytes or CHUNK_BYTES  # read at call time, so the module setting can be changed
    total = max(1, -(-len(entry.blob) // chunk_bytes))
    view = memoryview(entry.blob)
    for i in range(total):
        yield weight_broadcast_pb2.WeightChunk(
            job_id=entry.job_id, version=entry.version, index=i, total_chunks=total, total_bytes=len(entry.blob),
            sha256=entry.sha256, data=bytes(view[i * chunk_bytes:(i + 1) * chunk_bytes]))


class WeightBroadcastService(weight_broadcast_pb2_grpc.WeightBroadcastServicer):
    def __init__(self, store: VersionStore | None = None, poll_s: float = 1.0):
        self.store = store or VersionStore()
        self.poll_s = poll_s

    def Publish(self, request_iterator, context):
        parts: list[bytes] = []
        first = None
        claimed = ""
        hasher = hashlib.sha256()
        for chunk in request_iterator:
            if first is None:
                first = chunk
            elif (chunk.job_id, chunk.version) != (first.job_id, first.version):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "job_id/version: must be the same in every chunk")
            if chunk.index != len(parts):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"index: expected chunk {len(parts)}, got {chunk.index}")
            if chunk.sha256:
                if claimed and chunk.sha256 != claimed:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "sha256: differs between chunks")
                claimed = chunk.sha256  # may come with every chunk or only the last (a streaming publisher)
            data = chunk.data
            hasher.update(data)  # hashed while the rest arrives (hashlib releases the GIL)
            parts.append(data)
        if first is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no chunks sent")
        if not first.job_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "job_id is required")
        if first.total_chunks and len(parts) != first.total_chunks:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"total_chunks: got {len(parts)} chunks, expected {first.total_chunks}")
        blob = parts[0] if len(parts) == 1 else b"".join(parts)
        del parts
        if first.total_bytes and len(blob) != first.total_bytes:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"total_bytes: got {len(blob)}, expected {first.total_bytes}")
        digest = hasher.hexdigest()
        if claimed and digest != claimed:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"sha256: got {digest}, publisher said {claimed}")
        frames = frames_of(WeightVersion(first.job_id, first.version, blob, digest))
        try:
            entry = self.store.put(first.job_id, first.version, blob, claimed, actual_sha256=digest, frames=frames,
                                   pinned=first.pinned)
        except (ChecksumMismatch, ValueError) as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        VERSION.labels(entry.job_id).set(entry.version)
        PUBLISHED_BYTES.labels(entry.job_id).inc(len(blob))
        log.info("job %s: version %d published (%d bytes)", entry.job_id, entry.version, len(blob))
        return weight_broadcast_pb2.PublishResponse(version=entry.version, total_bytes=len(blob))

    def Subscribe(self, request, context):
        if not request.job_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "job_id is required")
        have = request.have_version
        SUBSCRIBERS.labels(request.job_id).inc()
        try:
            while context.is_active():
                entry = self.store.wait_newer(request.job_id, have, timeout=self.poll_s)
                if entry is None:
                    continue
                # A subscriber that missed versions gets the latest one only.
                yield from entry.frames or chunks_of(entry)
                SENT_BYTES.labels(request.job_id).inc(len(entry.blob))
                have = entry.version
        finally:
            SUBSCRIBERS.labels(request.job_id).dec()

    def Fetch(self, request, context):
        entry = self.store.get(request.job_id, request.version, release=request.release)
        if entry is None:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"version: job {request.job_id!r} has no version {request.version} (kept: last "
                          f"{self.store.keep_versions})")
        yield from entry.frames or chunks_of(entry)

    def GetLatest(self, request, context):
        entry = self.store.latest(request.job_id)
        if entry is None:
            return weight_broadcast_pb2.VersionInfo(job_id=request.job_id, version=-1)
        return weight_broadcast_pb2.VersionInfo(job_id=entry.job_id, version=entry.version, sha256=entry.sha256,
                                                total_bytes=len(entry.blob))


def main(settings) -> None:
    from scalerl.serving import ServiceRegistration, run_service

    service = WeightBroadcastService()
    registration = ServiceRegistration(["scalerl.v1.WeightBroadcast"], lambda s: add_to_server(service, s))
    run_service(settings, registration, max_workers=128)  # one worker per open subscription
