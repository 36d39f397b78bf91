"""Service bootstrap: a gRPC server with the standard health service and reflection, Prometheus /metrics on
its own port, clean shutdown on SIGTERM (stop accepting, drain in-flight RPCs, then background work)."""

from __future__ import annotations

import logging
import signal
import threading
from concurrent import futures
from dataclasses import dataclass, field
from typing import Callable, Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


@dataclass
class ServiceRegistration:
    """What a service adds to the shared server: `add(server)` registers servicers under `names`."""

    names: Iterable[str]
    add: Callable[[grpc.Server], None]


@dataclass
class RunningServer:
    server: grpc.Server
    health: health.HealthServicer
    grpc_port: int
    metrics_port: int
    names: list[str]
    stop_event: threading.Event = field(default_factory=threading.Event)

    def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ["", *self.names]:
            self.health.set(name, status)

    def stop(self, grace: float) -> None:
        self.set_serving(False)
        self.stop_event.set()
        self.server.stop(grace).wait()


def start_server(registration: ServiceRegistration, *, host: str, grpc_port: int, metrics_port: int | None,
                 max_workers: int = 32) -> RunningServer:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=GRPC_OPTIONS)
    registration.add(server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = list(registration.names)
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    bound = server.add_insecure_port(f"{host}:{grpc_port}")
    if bound == 0:
        raise RuntimeError(f"could not bind gRPC port {host}:{grpc_port}")
    server.start()
    actual_metrics = 0
    if metrics_port is not None:
        httpd, _ = start_http_server(metrics_port, addr=host)
        actual_metrics = httpd.server_port
    running = RunningServer(server, health_servicer, bound, actual_metrics, names)
    running.set_serving(True)
    return running


def serve_forever(running: RunningServer, *, drain_timeout_s: float,
                  on_shutdown: Callable[[], None] | None = None) -> None:
    """Block until SIGTERM/SIGINT, then drain: NOT_SERVING, finish in-flight RPCs, stop background work."""
    def handle(signum, _frame):
        log.info("signal %s: draining (up to %.0fs)", signal.Signals(signum).name, drain_timeout_s)
        running.stop_event.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    log.info("serving %s on gRPC port %d, metrics port %d", ",".join(running.names), running.grpc_port,
             running.metrics_port)
    running.stop_event.wait()
    running.set_serving(False)
    if on_shutdown is not None:
        on_shutdown()
    running.server.stop(drain_timeout_s).wait()
    log.info("stopped")


def channel(addr: str) -> grpc.Channel:
    return grpc.insecure_channel(addr, options=GRPC_OPTIONS)


def check_health(addr: str, service: str = "", timeout: float = 2.0) -> str:
    """grpc_health_probe equivalent: the serving status name, or UNREACHABLE."""
    try:
        with channel(addr) as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service),
                                                         timeout=timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    except grpc.RpcError:
        return "UNREACHABLE"


def run_service(settings, registration: ServiceRegistration, *,
                background: Callable[[threading.Event], None] | None = None,
                on_shutdown: Callable[[], None] | None = None, max_workers: int = 32) -> None:
    """Every service's main: serve `registration` on the settings' ports, run `background(stop_event)` in a
    thread (job loops), block until SIGTERM, then drain."""
    grpc_port, metrics_port = settings.ports()
    running = start_server(registration, host=settings.host, grpc_port=grpc_port, metrics_port=metrics_port,
                           max_workers=max_workers)
    worker = None
    if background is not None:
        worker = threading.Thread(target=background, args=(running.stop_event,), name=f"{settings.service}-work",
                                  daemon=True)
        worker.start()

    def shutdown() -> None:
        if on_shutdown is not None:
            on_shutdown()
        if worker is not None:
            worker.join(settings.drain_timeout_s)

    serve_forever(running, drain_timeout_s=settings.drain_timeout_s, on_shutdown=shutdown)
