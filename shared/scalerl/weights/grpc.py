"""Weights over the weight-broadcast service's gRPC streams: named tensors travel as one safetensors blob cut
into WeightChunk messages (the wire format is this module's own business)."""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import Iterable, Iterator

import grpc

from scalerl import errors
from scalerl.logs import job_logger
from scalerl.serving import channel
from scalerl.v1 import weight_broadcast_pb2, weight_broadcast_pb2_grpc
from scalerl.weights.base import CHUNK_BYTES, GrpcWeightTransportConfig, NamedTensors, WeightTransport
from scalerl.weights.codec import SafetensorsBlob, to_safetensors

log = logging.getLogger(__name__)


def _assemble(chunks: Iterable[weight_broadcast_pb2.WeightChunk]) -> Iterator[SafetensorsBlob]:
    """Chunks -> verified versions; hashed as the chunks arrive, so verifying costs no extra pass."""
    parts: list[bytes] = []
    hasher = hashlib.sha256()
    for chunk in chunks:
        if chunk.index == 0:
            parts, hasher = [], hashlib.sha256()
        elif chunk.index != len(parts):
            raise ValueError(f"weights v{chunk.version}: chunk {chunk.index} arrived after {len(parts)} chunk(s)")
        data = chunk.data
        hasher.update(data)
        parts.append(data)
        if chunk.index == chunk.total_chunks - 1:
            blob = parts[0] if len(parts) == 1 else b"".join(parts)
            parts = []
            if hasher.hexdigest() != chunk.sha256:
                raise ValueError(f"weights v{chunk.version}: checksum mismatch")
            yield SafetensorsBlob(chunk.job_id, chunk.version, blob, chunk.sha256)


class GrpcStreamTransport(WeightTransport):
    def __init__(self, addr: str, *, chunk_bytes: int = CHUNK_BYTES, timeout_s: float = 300.0):
        if not addr:
            raise errors.InvalidArgument("the weight-broadcast address is empty", field="weight_transport.addr")
        self.chunk_bytes = chunk_bytes
        self.timeout_s = timeout_s
        self._channel = channel(addr)
        self._stub = weight_broadcast_pb2_grpc.WeightBroadcastStub(self._channel)

    @classmethod
    def from_config(cls, config: GrpcWeightTransportConfig) -> "GrpcStreamTransport":
        return cls(config.addr, chunk_bytes=config.chunk_bytes, timeout_s=config.timeout_s)

    def publish(self, job_id: str, version: int, tensors: NamedTensors, pinned: bool = False) -> None:
        self.publish_bytes(job_id, version, to_safetensors(tensors), pinned=pinned)

    def publish_bytes(self, job_id: str, version: int, blob: bytes, pinned: bool = False) -> None:
        """The wire level: publish an already-encoded blob (tests and benchmarks of the service)."""
        chunk_bytes = self.chunk_bytes
        total = max(1, -(-len(blob) // chunk_bytes))
        view = memoryview(blob)

        def chunks():
            # hashed while streaming: the checksum travels with the last chunk (the service verifies it)
            hasher = hashlib.sha256()
            for i in range(total):
                data = bytes(view[i * chunk_bytes:(i + 1) * chunk_bytes])
                hasher.update(data)
                yield weight_broadcast_pb2.WeightChunk(
                    job_id=job_id, version=version, index=i, total_chunks=total, total_bytes=len(blob),
                    sha256=hasher.hexdigest() if i == total - 1 else "", data=data, pinned=pinned)

        self._stub.Publish(chunks(), timeout=self.timeout_s)

    def subscribe(self, job_id: str, have_version: int, stop: threading.Event) -> Iterator[SafetensorsBlob]:
        jlog = job_logger(log, job_id)
        while not stop.is_set():
            call = self._stub.Subscribe(weight_broadcast_pb2.SubscribeRequest(job_id=job_id,
                                                                              have_version=have_version))
            done = threading.Event()

            def cancel_on_stop(call=call, done=done):
                # ends with the call: no thread is left behind per (re)subscription
                while not done.is_set():
                    if stop.wait(0.2):
                        call.cancel()
                        return

            threading.Thread(target=cancel_on_stop, daemon=True, name="weights-subscription-stop").start()
            try:
                for received in _assemble(call):
                    have_version = received.version
                    yield received
            except grpc.RpcError as err:
                if stop.is_set() or err.code() == grpc.StatusCode.CANCELLED:
                    return
                jlog.warning("weight subscription broke (%s); resubscribing", err.code().name)
                stop.wait(1.0)
            finally:
                # also when the consumer closes the generator: end the server-side stream now
                done.set()
                call.cancel()

    def fetch(self, job_id: str, version: int, release: bool = False) -> SafetensorsBlob:
        call = self._stub.Fetch(weight_broadcast_pb2.FetchRequest(job_id=job_id, version=version, release=release),
                                timeout=self.timeout_s)
        for received in _assemble(call):
            return received
        raise RuntimeError(f"weights v{version}: empty fetch")

    def latest_version(self, job_id: str) -> int:
        return self._stub.GetLatest(weight_broadcast_pb2.GetLatestRequest(job_id=job_id), timeout=10).version

    def close(self) -> None:
        self._channel.close()
