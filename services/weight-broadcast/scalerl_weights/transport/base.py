"""How weights move from the learner to generators. The generator loop only sees this interface, so an NCCL or
shared-volume transport can be added beside the gRPC stream without touching it."""

from __future__ import annotations

import hashlib
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class ReceivedWeights:
    job_id: str
    version: int
    blob: bytes
    """safetensors bytes of the full state dict."""
    sha256: str

    def verify(self) -> None:
        if hashlib.sha256(self.blob).hexdigest() != self.sha256:
            raise ValueError(f"weights v{self.version}: checksum mismatch")


class WeightTransport(ABC):
    @abstractmethod
    def publish(self, job_id: str, version: int, blob: bytes, pinned: bool = False) -> None:
        """Learner side: publish one version once (fan-out is the transport's job). A pinned version stays
        fetchable until fetched with release=True (validation of exactly that version)."""

    @abstractmethod
    def subscribe(self, job_id: str, have_version: int, stop: threading.Event) -> Iterator[ReceivedWeights]:
        """Generator side: yields the latest version newer than `have_version`, then each later one."""

    @abstractmethod
    def fetch(self, job_id: str, version: int, release: bool = False) -> ReceivedWeights:
        """One pinned version (validation)."""

    def close(self) -> None:
        pass


def make_transport(kind: str, addr: str) -> WeightTransport:
    if kind == "grpc":
        from scalerl_weights.transport.grpc_stream import GrpcStreamTransport

        return GrpcStreamTransport(addr)
    raise ValueError(f"weight transport: unknown kind {kind!r} (known: grpc)")
