"""The whole stack on localhost: `scalerl up`'s supervisor with embedded Valkey, SQLite, real gRPC, real vLLM."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import httpx
import pytest

from scalerl_stack.supervisor import Stack

TOKEN = "e2e-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("stack")
    http_port = _free_port()
    saved = dict(os.environ)
    os.environ.update({"SCALERL_API_TOKEN": TOKEN, "SCALERL_HTTP_PORT": str(http_port),
                       "SCALERL_POLL_INTERVAL_S": "0.5", "SCALERL_LOG_JSON": "true",
                       "SCALERL_MAX_GROUPS_IN_FLIGHT": "8"})
    os.environ.pop("REDIS_URL", None)
    stack = Stack(Path(data_dir), generators=2, free_ports=True)
    stack.start()
    try:
        if not stack.wait_serving(300):
            raise RuntimeError(f"stack not SERVING: {stack.health()}; logs in {data_dir / 'logs'}")
        yield stack, f"http://127.0.0.1:{http_port}"
    finally:
        stack.stop()
        os.environ.clear()
        os.environ.update(saved)
        for log in sorted((Path(data_dir) / "logs").glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-15:]
            print(f"==== {log.name}\n" + "\n".join(tail))


@pytest.fixture(scope="session")
def api(stack):
    _, url = stack
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as client:
        yield client
