"""Replay-buffer process: stateless; every replica serves the same Redis."""

from __future__ import annotations

import redis

from scalerl.serving import ServiceRegistration, serve_forever, start_server
from scalerl.settings import Settings
from scalerl_buffer.metrics import register_metrics
from scalerl_buffer.service import add_to_server


def main(settings: Settings) -> None:
    if not settings.redis_url:
        raise SystemExit("REDIS_URL: not set (the replay buffer keeps all its state in Redis)")
    client = redis.Redis.from_url(settings.redis_url)
    client.ping()
    holder = {}

    def add(server):
        holder["service"] = add_to_server(server, client)

    grpc_port, metrics_port = settings.ports()
    running = start_server(ServiceRegistration(["scalerl.v1.ReplayBuffer"], add), host=settings.host,
                           grpc_port=grpc_port, metrics_port=metrics_port)
    register_metrics(holder["service"].store)
    serve_forever(running, drain_timeout_s=settings.drain_timeout_s, on_shutdown=client.close)
