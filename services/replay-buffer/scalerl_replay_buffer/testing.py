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


def start_buffer_server(redis_client, **store_kwargs):
    """A replay-buffer gRPC server over `redis_client` on a free local port (no metrics), started; the caller stops
    it. `store_kwargs` go to its BufferStore."""
    from scalerl.serving import ServiceRegistration, start_server
    from scalerl_replay_buffer.service import add_to_server

    return start_server(ServiceRegistration(["scalerl.v1.ReplayBuffer"],
                                            lambda s: add_to_server(s, redis_client, **store_kwargs)),
                        host="127.0.0.1", grpc_port=0, metrics_port=None, max_workers=8)
