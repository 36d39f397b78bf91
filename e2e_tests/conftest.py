"""The whole stack on localhost: `scalerl up`'s supervisor with embedded Valkey, SQLite, real gRPC, real vLLM."""

from __future__ import annotations

import httpx
import pytest

from e2e_support import running_stack

TOKEN = "e2e-token"


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    with running_stack(tmp_path_factory.mktemp("stack"), TOKEN, generators=2) as running:
        yield running


@pytest.fixture(scope="session")
def api(stack):
    _, url = stack
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as client:
        yield client
