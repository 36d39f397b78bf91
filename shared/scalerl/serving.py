"""Service bootstrap: a gRPC server with the standard health service and reflection, one error mapping
(domain errors -> status codes), Prometheus /metrics on its own port, clean shutdown on SIGTERM (stop
accepting, drain in-flight RPCs, then background work)."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterable, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server
from pydantic import ValidationError

from scalerl import errors

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]

# Every client call waits for a (re)connection and retries UNAVAILABLE with exponential backoff, all within the
# call's own deadline: a peer restarted by its supervisor (or a rolling update) costs a delay, not a failure.
# gRPC retries a call only until the server has sent response headers, so a stream broken midway (e.g. a weight
# subscription) is resumed by its caller. maxAttempts is capped at 5 by gRPC; waitForReady covers the longer
# outages (the wait for a connection spends no attempt), the short reconnect backoff keeps that wait short.
RETRY_POLICY = {
    "maxAttempts": 5,
    "initialBackoff": "0.2s",
    "maxBackoff": "5s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
SERVICE_CONFIG = {"methodConfig": [{"name": [{}], "waitForReady": True, "retryPolicy": RETRY_POLICY}]}
CHANNEL_OPTIONS = [
    *GRPC_OPTIONS,
    ("grpc.enable_retries", 1),
    ("grpc.service_config", json.dumps(SERVICE_CONFIG)),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
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
        deserialize = _tolerant(handler.request_deserializer)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, method), deserialize, handler.response_serializer)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(handler.unary_stream, method), deserialize, handler.response_serializer)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(handler.stream_unary, method, streamed=True), deserialize, handler.response_serializer)
        return grpc.stream_stream_rpc_method_handler(
            self._streaming(handler.stream_stream, method, streamed=True), deserialize, handler.response_serializer)

    @staticmethod
    def _abort(err: Exception, request, context, method: str):
        job_id = getattr(err, "job_id", None) or getattr(request, "job_id", "") or ""
        code = status_of(err)
        if code is None:
            log.error("%s failed", method, exc_info=err, extra={"job_id": job_id})
            context.abort(grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}")
        log.warning("%s -> %s: %s", method, code.name, _describe(err), extra={"job_id": job_id})
        context.abort(code, _describe(err))

    def _unary(self, behavior, method: str, streamed: bool = False):
        def wrapper(request, context):
            try:
                return behavior(_checked_stream(request) if streamed else _checked(request), context)
            except Exception as err:
                if _is_abort(err, context):
                    raise
                self._abort(err, request, context, method)

        return wrapper

    def _streaming(self, behavior, method: str, streamed: bool = False):
        def wrapper(request, context):
            try:
                yield from behavior(_checked_stream(request) if streamed else _checked(request), context)
            except Exception as err:
                if _is_abort(err, context):
                    raise
                self._abort(err, request, context, method)

        return wrapper


class _Undecodable:
    """Stands for a request message that did not parse (gRPC itself would answer INTERNAL for it)."""

    def __init__(self, err: Exception):
        self.err = err


def _tolerant(deserialize):
    if deserialize is None:
        return None

    def wrapper(data: bytes):
        try:
            return deserialize(data)
        except Exception as err:
            return _Undecodable(err)

    return wrapper


def _checked(request):
    if isinstance(request, _Undecodable):
        raise errors.InvalidArgument(f"the request is not a valid message for this method "
                                     f"({type(request.err).__name__})", field="request")
    return request


def _checked_stream(requests):
    for request in requests:
        yield _checked(request)


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
    """The one way a service calls another: retries and waits for a restarted peer within each call's deadline
    (so every call must carry a timeout, or be a stream its caller cancels)."""
    return grpc.insecure_channel(addr, options=CHANNEL_OPTIONS)


def call_until_answered(call: Callable[[float], T], *, deadline_s: float, retryable: Collection[grpc.StatusCode],
                        attempt_timeout: Callable[[float], float], on_retry: Callable[[BaseException], None],
                        retry_errors: tuple[type[BaseException], ...] = ()) -> T:
    """`call(timeout)` again, with backoff (0.5 s doubling up to 5 s), while it fails with a `retryable` code (or
    one of `retry_errors`: a call that is not gRPC, like the weights' TCP data plane) and `deadline_s` leaves room
    for the wait; then that error is raised. For what the channel's own retries cannot cover: a stream broken
    midway, or an outage longer than a call's deadline. `attempt_timeout(left)` is the timeout of one attempt
    given the seconds left; `on_retry(err)` runs before each wait (to log it)."""
    deadline = time.monotonic() + deadline_s
    backoff = 0.5
    while True:
        try:
            return call(attempt_timeout(deadline - time.monotonic()))
        except (grpc.RpcError, *retry_errors) as err:
            again = err.code() in retryable if isinstance(err, grpc.RpcError) else isinstance(err, retry_errors)
            if not again or time.monotonic() + backoff >= deadline:
                raise
            on_retry(err)
        time.sleep(backoff)
        backoff = min(backoff * 2, 5.0)


def check_health(addr: str, service: str = "", timeout: float = 2.0) -> str:
    """grpc_health_probe equivalent: the serving status name, or UNREACHABLE."""
    try:
        with channel(addr) as ch:
            # a probe answers now: no waiting for a server that is not there
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service),
                                                         timeout=timeout, wait_for_ready=False)
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
