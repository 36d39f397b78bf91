"""WeightBroadcast gRPC servicer (thin): the learner uploads a version once as chunks, every subscriber is
streamed it. Chunks are decoded and checked here; the versions live in `store.VersionStore`. Errors are
scalerl.errors, mapped to status codes by the bootstrap's interceptor."""

from __future__ import annotations

import hashlib
import logging

import grpc

from scalerl import errors
from scalerl.logs import job_logger
from scalerl.v1 import weight_broadcast_pb2, weight_broadcast_pb2_grpc
from scalerl.weights.base import CHUNK_BYTES
from scalerl_weight_broadcast import metrics
from scalerl_weight_broadcast.store import VersionStore, WeightVersion

log = logging.getLogger(__name__)


def chunks_of(entry: WeightVersion, chunk_bytes: int = CHUNK_BYTES):
    total = max(1, -(-len(entry.blob) // chunk_bytes))
    view = memoryview(entry.blob)
    for i in range(total):
        yield weight_broadcast_pb2.WeightChunk(
            job_id=entry.job_id, version=entry.version, index=i, total_chunks=total, total_bytes=len(entry.blob),
            sha256=entry.sha256, data=bytes(view[i * chunk_bytes:(i + 1) * chunk_bytes]))


def frames_of(entry: WeightVersion, chunk_bytes: int = CHUNK_BYTES) -> tuple[bytes, ...]:
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


def decode_upload(chunks) -> tuple[weight_broadcast_pb2.WeightChunk, bytes, str, str]:
    """Publish's chunk stream -> (first chunk, blob, sha256 the publisher claimed, sha256 of the bytes)."""
    parts: list[bytes] = []
    first = None
    claimed = ""
    hasher = hashlib.sha256()
    for chunk in chunks:
        if first is None:
            first = chunk
        elif (chunk.job_id, chunk.version) != (first.job_id, first.version):
            raise errors.InvalidArgument("must be the same in every chunk", field="job_id/version",
                                         job_id=first.job_id)
        if chunk.index != len(parts):
            raise errors.InvalidArgument(f"expected chunk {len(parts)}, got {chunk.index}", field="index",
                                         job_id=first.job_id)
        if chunk.sha256:
            if claimed and chunk.sha256 != claimed:
                raise errors.InvalidArgument("differs between chunks", field="sha256", job_id=first.job_id)
            claimed = chunk.sha256  # may come with every chunk or only the last (a streaming publisher)
        data = chunk.data
        hasher.update(data)  # hashed while the rest arrives (hashlib releases the GIL)
        parts.append(data)
    if first is None:
        raise errors.InvalidArgument("no chunks sent")
    if not first.job_id:
        raise errors.InvalidArgument("is required", field="job_id")
    if first.total_chunks and len(parts) != first.total_chunks:
        raise errors.InvalidArgument(f"got {len(parts)} chunks, expected {first.total_chunks}",
                                     field="total_chunks", job_id=first.job_id)
    blob = parts[0] if len(parts) == 1 else b"".join(parts)
    if first.total_bytes and len(blob) != first.total_bytes:
        raise errors.InvalidArgument(f"got {len(blob)}, expected {first.total_bytes}", field="total_bytes",
                                     job_id=first.job_id)
    return first, blob, claimed, hasher.hexdigest()


class WeightBroadcastService(weight_broadcast_pb2_grpc.WeightBroadcastServicer):
    def __init__(self, store: VersionStore | None = None, poll_s: float = 1.0, chunk_bytes: int = CHUNK_BYTES):
        self.store = store or VersionStore()
        self.poll_s = poll_s
        self.chunk_bytes = chunk_bytes

    def Publish(self, request_iterator, context):
        first, blob, claimed, digest = decode_upload(request_iterator)
        frames = frames_of(WeightVersion(first.job_id, first.version, blob, digest), self.chunk_bytes)
        entry = self.store.put(first.job_id, first.version, blob, claimed, actual_sha256=digest, frames=frames,
                               pinned=first.pinned)
        metrics.VERSION.labels(entry.job_id).set(self.store.latest(entry.job_id).version)  # a re-pin is older
        metrics.PUBLISHED_BYTES.labels(entry.job_id).inc(len(blob))
        job_logger(log, entry.job_id).info("version published (%d bytes)", len(blob),
                                           extra={"version": entry.version})
        return weight_broadcast_pb2.PublishResponse(version=entry.version, total_bytes=len(blob))

    def Subscribe(self, request, context):
        if not request.job_id:
            raise errors.InvalidArgument("is required", field="job_id")
        have = request.have_version
        metrics.SUBSCRIBERS.labels(request.job_id).inc()
        try:
            while context.is_active():
                entry = self.store.wait_newer(request.job_id, have, timeout=self.poll_s)
                if entry is None:
                    continue
                # A subscriber that missed versions gets the latest one only.
                yield from entry.frames or chunks_of(entry, self.chunk_bytes)
                metrics.SENT_BYTES.labels(request.job_id).inc(len(entry.blob))
                have = entry.version
        finally:
            metrics.SUBSCRIBERS.labels(request.job_id).dec()

    def Fetch(self, request, context):
        entry = self.store.require(request.job_id, request.version, release=request.release)
        yield from entry.frames or chunks_of(entry, self.chunk_bytes)

    def GetLatest(self, request, context):
        entry = self.store.latest(request.job_id)
        if entry is None:
            return weight_broadcast_pb2.VersionInfo(job_id=request.job_id, version=-1)
        return weight_broadcast_pb2.VersionInfo(job_id=entry.job_id, version=entry.version, sha256=entry.sha256,
                                                total_bytes=len(entry.blob))
