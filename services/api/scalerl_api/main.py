"""The api service: REST (FastAPI) for users, ControlPlane (gRPC) for the services, one process."""

from __future__ import annotations

import logging
import threading

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from scalerl.serving import ServiceRegistration, run_service
from scalerl.settings import Settings
from scalerl.v1 import control_plane_pb2_grpc
from scalerl_api.api.deps import require_token
from scalerl_api.api.routes import admin, jobs
from scalerl_api.backends import BackendUnavailable, Backends
from scalerl_api.control_plane import ControlPlaneService
from scalerl_api.db import make_engine, make_sessionmaker, migrate
from scalerl_api.lifecycle import JobLifecycle
from scalerl_api.scheduler import Scheduler
from scalerl_api.schemas import UNAUTHORIZED

log = logging.getLogger(__name__)


def create_app(settings: Settings, backends: Backends) -> FastAPI:
    engine = make_engine(settings.database_url)
    migrate(engine)
    app = FastAPI(title="ScaleRL", version="0.1.0",
                  description="Submit RL post-training jobs with the ScaleRL recipe and read their live forecast.")
    app.state.settings = settings
    app.state.sessionmaker = make_sessionmaker(engine)
    app.state.backends = backends
    auth = [Depends(require_token)]
    app.include_router(jobs.router, dependencies=auth, responses=UNAUTHORIZED)
    app.include_router(jobs.compare_router, dependencies=auth, responses=UNAUTHORIZED)
    app.include_router(admin.router, dependencies=auth, responses=UNAUTHORIZED)

    @app.exception_handler(BackendUnavailable)
    def backend_unavailable(request: Request, err: BackendUnavailable) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=503)

    @app.middleware("http")
    async def allow_header_on_405(request: Request, call_next):
        # A path served by several routes (GET and POST /v1/jobs) must list all their methods (RFC 9110).
        response = await call_next(request)
        if response.status_code == 405:
            methods = {m for route in app.routes if isinstance(route, APIRoute)
                       and route.path_regex.match(request.url.path) for m in route.methods}
            response.headers["Allow"] = ", ".join(sorted(methods))
        return response

    @app.get("/healthz", tags=["health"])
    def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return app


def main(settings: Settings) -> None:
    import uvicorn

    backends = Backends(settings)
    app = create_app(settings, backends)
    scheduler = Scheduler(app.state.sessionmaker, backends, settings.poll_interval_s)
    http = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.http_port, log_level="warning",
                                         access_log=False))

    def add(server):
        control_plane_pb2_grpc.add_ControlPlaneServicer_to_server(
            ControlPlaneService(JobLifecycle(app.state.sessionmaker, backends)), server)

    def background(stop: threading.Event) -> None:
        http_thread = threading.Thread(target=http.run, name="http", daemon=True)
        http_thread.start()
        log.info("REST on http://%s:%d (OpenAPI at /docs)", settings.host, settings.http_port)
        scheduler.run_until(stop)
        http.should_exit = True
        http_thread.join(settings.drain_timeout_s)
        backends.close()

    run_service(settings, ServiceRegistration(["scalerl.v1.ControlPlane"], add), background=background)
