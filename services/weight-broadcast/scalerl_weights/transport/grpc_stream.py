"""Weights over the weight-broadcast service's gRPC streams."""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import Iterable, Iterator

import grpc

from scalerl.serving import channel
from scalerl.v1 import weight_broadcast_pb2, weight_broadcast_pb2_grpc
from scalerl_weights.service import CHUNK_BYTES
from scalerl_weights.transport.base import ReceivedWeights, WeightTransport

log = logging.getLogger(__name__)


def _assemble(chunks: Iterable[weight_broadcast_pb2.WeightChunk]) -> Iterator[ReceivedWeights]:
    parts: list[bytes] = []
    for chunk in chunks:
        if chunk.index == 0:
            parts = []
        parts.append(chunk.data)
        if chunk.index == chunk.total_chunks - 1:
            received = ReceivedWeights(chunk.job_id, chunk.version, b"".join(parts), chunk.sha256)
            received.verify()
            yield received
            parts = []


class GrpcStreamTransport(WeightTransport):
    def __init__(self, addr: str):
        self._channel = channel(addr)
        self._stub = weight_broadcast_pb2_grpc.WeightBroadcastStub(self._channel)

    def publish(self, job_id: str, version: int, blob: bytes) -> None:
        digest = hashlib.sha256(blob).hexdigest()
        total = max(1, -(-len(blob) // CHUNK_BYTES))
        view = memoryview(blob)

        def chunks():
            for i in range(total):
                yield weight_broadcast_pb2.WeightChunk(
                    job_id=job_id, version=version, index=i, total_chunks=total, total_bytes=len(blob),
                    sha256=digest, data=bytes(view[i * CHUNK_BYTES:(i + 1) * CHUNK_BYTES]))

        self._stub.Publish(chunks(), timeout=300)

    def subscribe(self, job_id: str, have_version: int, stop: threading.Event) -> Iterator[ReceivedWeights]:
        while not stop.is_set():
            call = self._stub.Subscribe(weight_broadcast_pb2.SubscribeRequest(job_id=job_id,
                                                                              have_version=have_version))
            canceller = threading.Thread(target=lambda: (stop.wait(), call.cancel()), daemon=True)
            canceller.start()
            try:
                for received in _assemble(call):
                    have_version = received.version
                    yield received
            except grpc.RpcError as err:
                if stop.is_set() or err.code() == grpc.StatusCode.CANCELLED:
                    return
                log.warning("weight subscription broke (%s); resubscribing", err.code().name)
                stop.wait(1.0)

    def fetch(self, job_id: str, version: int) -> ReceivedWeights:
        call = self._stub.Fetch(weight_broadcast_pb2.FetchRequest(job_id=job_id, version=version), timeout=300)
        for received in _assemble(call):
            return received
        raise RuntimeError(f"weights v{version}: empty fetch")

    def latest_version(self, job_id: str) -> int:
        return self._stub.GetLatest(weight_broadcast_pb2.GetLatestRequest(job_id=job_id), timeout=10).version

    def close(self) -> None:
        self._channel.close()
