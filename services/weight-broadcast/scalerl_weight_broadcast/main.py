"""weight-broadcast process: settings -> store + servicer -> the shared gRPC bootstrap."""

from __future__ import annotations

from scalerl.serving import ServiceRegistration, run_service
from scalerl.settings import Settings
from scalerl.weights.base import CHUNK_BYTES, GrpcWeightTransportConfig
from scalerl_weight_broadcast.service import WeightBroadcastService, add_to_server
from scalerl_weight_broadcast.store import VersionStore


def build_service(settings: Settings) -> WeightBroadcastService:
    transport = settings.weight_transport
    chunk_bytes = transport.chunk_bytes if isinstance(transport, GrpcWeightTransportConfig) else CHUNK_BYTES
    return WeightBroadcastService(VersionStore(), chunk_bytes=chunk_bytes)


def main(settings: Settings) -> None:
    service = build_service(settings)
    registration = ServiceRegistration(["scalerl.v1.WeightBroadcast"], lambda server: add_to_server(service, server))
    run_service(settings, registration, max_workers=128)  # one worker per open subscription
