"""Fixtures for the api: a real job store (SQLite file by default, SCALERL_TEST_DATABASE_URL for Postgres) and
real backends (a replay-buffer on a real Redis-protocol server, a forecaster) behind real gRPC servers."""

from __future__ import annotations

import os
from concurrent import futures

import grpc
import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import text

from scalerl.settings import Settings
from scalerl.v1 import forecaster_pb2_grpc
from scalerl_api.backends import Backends
from scalerl_api.db import make_engine
from scalerl_api.main import create_app
from scalerl_buffer.testing import redis_url  # noqa: F401  (fixture)
from scalerl_buffer.service import add_to_server
from scalerl_forecaster.service import ForecasterService

TOKEN = "test-token"


@pytest.fixture(scope="session")
def backend_addrs(redis_url, tmp_path_factory):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    client = redis.Redis.from_url(redis_url)
    add_to_server(server, client)
    forecaster = ForecasterService(state_dir=tmp_path_factory.mktemp("forecaster"))
    forecaster_pb2_grpc.add_ForecasterServicer_to_server(forecaster, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield {"addr": f"127.0.0.1:{port}", "forecaster": forecaster, "redis": client}
    server.stop(0)
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
