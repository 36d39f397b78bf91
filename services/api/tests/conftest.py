"""Fixtures for the api: a real job store (SQLite file by default, SCALERL_TEST_DATABASE_URL for Postgres) and
real backends (a replay-buffer on a real Redis-protocol server, a forecaster) behind a real gRPC server, the
service bootstrap's (with its error interceptor)."""

from __future__ import annotations

import os

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import text

from scalerl.serving import ServiceRegistration, start_server
from scalerl.settings import Settings
from scalerl_api.backends import Backends
from scalerl_api.db import make_engine
from scalerl_api.main import create_app
from scalerl_forecaster import service as forecaster_service
from scalerl_forecaster.jobs import Forecasts
from scalerl_replay_buffer import service as buffer_service
from scalerl_replay_buffer.testing import redis_url  # noqa: F401  (fixture)

TOKEN = "test-token"


@pytest.fixture(scope="session")
def backend_addrs(redis_url, tmp_path_factory):
    client = redis.Redis.from_url(redis_url)
    forecasts = Forecasts(state_dir=tmp_path_factory.mktemp("forecaster"))

    def add(server):
        buffer_service.add_to_server(server, client)
        forecaster_service.add_to_server(server, forecasts)

    running = start_server(ServiceRegistration(["scalerl.v1.ReplayBuffer", "scalerl.v1.Forecaster"], add),
                           host="127.0.0.1", grpc_port=0, metrics_port=None, max_workers=8)
    yield {"addr": f"127.0.0.1:{running.grpc_port}", "forecaster": forecasts, "redis": client}
    running.stop(0)
    client.close()


@pytest.fixture
def database_url(tmp_path):
    url = os.environ.get("SCALERL_TEST_DATABASE_URL")
    if not url:
        return f"sqlite:///{tmp_path / 'jobs.db'}"
    engine = make_engine(url)
    with engine.begin() as conn:  # a clean schema each test: migrations run from scratch
        conn.execute(text("DROP TABLE IF EXISTS jobs"))
        conn.execute(text("DROP TABLE IF EXISTS alembic_version"))
    engine.dispose()
    return url


@pytest.fixture
def settings(database_url, backend_addrs):
    return Settings(database_url=database_url, api_token=TOKEN, replay_buffer_addr=backend_addrs["addr"],
                    forecaster_addr=backend_addrs["addr"])


@pytest.fixture
def app(settings):
    backends = Backends(settings)
    app = create_app(settings, backends)
    yield app
    backends.close()


@pytest.fixture
def client(app):
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c
