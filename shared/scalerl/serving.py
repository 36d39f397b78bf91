"""Service bootstrap: a gRPC server with the standard health service and reflection, one error mapping
(domain errors -> status codes), Prometheus /metrics on its own port, clean shutdown on SIGTERM (stop
accepting, drain in-flight RPCs, then background work)."""

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
from pydantic import ValidationError

from scalerl import errors

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


# The one table from domain errors to gRPC status codes (most specific class first).
STATUS_OF_ERROR: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
    (ValidationError, grpc.StatusCode.INVALID_ARGUMENT),
)


def status_of(err: BaseException) -> grpc.StatusCode | None:
    for cls, code in STATUS_OF_ERROR:
        if isinstance(err, cls):
            return code
    return None


def _describe(err: BaseException) -> str:
    if isinstance(err, ValidationError):  # name the field: "recipe.loss.eps_max: Input should be greater than 0"
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "request"
        more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
        return f"{where}: {first['msg']}{more}"
    return str(err)


class ErrorInterceptor(grpc.ServerInterceptor):
    """Domain errors raised by a servicer become their status code; anything else is INTERNAL. Each failure is
    logged once, here, with the request's job id as a structured field."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, method), handler.request_deserializer, handler.response_serializer)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(handler.unary_stream, method), handler.request_deserializer,
                handler.response_serializer)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(handler.stream_unary, method), handler.request_deserializer, handler.response_serializer)
        return grpc.stream_stream_rpc_method_handler(
            self._streaming(handler.stream_stream, method), handler.request_deserializer,
            handler.response_serializer)

    @staticmethod
    def _abort(err: Exception, request, context, method: str):
        job_id = getattr(err, "job_id", None) or getattr(request, "job_id", "") or ""
        code = status_of(err)
        if code is None:
            log.error("%s failed", method, exc_info=err, extra={"job_id": job_id})
            context.abort(grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}")
        log.warning("%s -> %s: %s", method, code.name, _describe(err), extra={"job_id": job_id})
        context.abort(code, _describe(err))

    def _unary(self, behavior, method: str):
        def wrapper(request, context):
            try:
                return behavior(request, context)
            except Exception as err:
                if _is_abort(err, context):
                    raise
                self._abort(err, request, context, method)

        return wrapper

    def _streaming(self, behavior, method: str):
        def wrapper(request, context):
            try:
                yield from behavior(request, context)
            except Exception as err:
                if _is_abort(err, context):
                    raise
                self._abort(err, request, context, method)

        return wrapper


def _is_abort(err: Exception, context) -> bool:
    """`context.abort` raises a bare Exception after setting the code: let it through untouched."""
    return type(err) is Exception and context.code() not in (None, grpc.StatusCode.OK)


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
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=GRPC_OPTIONS,
                         interceptors=[ErrorInterceptor()])
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
