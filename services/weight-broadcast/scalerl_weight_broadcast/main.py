"""weight-broadcast process: settings -> store + servicer -> the shared gRPC bootstrap."""

from __future__ import annotations

from scalerl.control import follow_active_job
from scalerl.serving import ServiceRegistration, run_service
from scalerl.settings import Settings
from scalerl.weights.base import GrpcWeightTransportConfig
from scalerl.weights.chunked import VersionStore
from scalerl_weight_broadcast.service import WeightBroadcastService, add_to_server


def build_service(settings: Settings) -> WeightBroadcastService:
    transport = settings.weight_transport
    grpc_transport = isinstance(transport, GrpcWeightTransportConfig)
    store = VersionStore(keep_versions=transport.hub_keep_versions if grpc_transport else 2)
    service = WeightBroadcastService(store, relay_fanout=transport.relay_fanout if grpc_transport else 2)
    service.serve_data(settings.host, transport.data_port if grpc_transport else 0)
    return service


def main(settings: Settings) -> None:
    service = build_service(settings)
    registration = ServiceRegistration(["scalerl.v1.WeightBroadcast"], lambda server: add_to_server(service, server))
    run_service(settings, registration, max_workers=128,  # one worker per open subscription
                background=lambda stop: follow_active_job(settings.control_plane_addr, "weight-broadcast",
                                                          service.keep_only, stop, settings.poll_interval_s))
