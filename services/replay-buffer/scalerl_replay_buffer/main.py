"""Replay-buffer process: stateless; every replica serves the same Redis."""

from __future__ import annotations

import redis

from scalerl.serving import ServiceRegistration, run_service
from scalerl.settings import Settings
from scalerl_replay_buffer.metrics import register_metrics
from scalerl_replay_buffer.service import add_to_server


def main(settings: Settings) -> None:
    if not settings.redis_url:
        raise SystemExit("REDIS_URL: not set (the replay buffer keeps all its state in Redis)")
    client = redis.Redis.from_url(settings.redis_url)
    client.ping()

    def add(server):
        register_metrics(add_to_server(server, client).store)

    run_service(settings, ServiceRegistration(["scalerl.v1.ReplayBuffer"], add), on_shutdown=client.close)
