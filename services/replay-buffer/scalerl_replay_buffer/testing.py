"""Test fixtures shared by every suite that needs a real Redis-protocol server (never a fake)."""

from __future__ import annotations

import os

import pytest

from scalerl_replay_buffer.embedded import EmbeddedValkey


@pytest.fixture(scope="session")
def redis_url():
    """SCALERL_TEST_REDIS_URL (CI: the machine's Redis) or a session-wide embedded Valkey."""
    url = os.environ.get("SCALERL_TEST_REDIS_URL")
    if url:
        yield url
        return
    with EmbeddedValkey() as server:
        yield server.url
