"""Generator process (role rollout or evaluator): settings -> replica + servicer -> the shared gRPC bootstrap,
with the job loop (`jobs.work_loop`) as background work and readiness following the vLLM engine."""

from __future__ import annotations

import os
import socket
import threading

from scalerl.serving import ServiceRegistration, health_pb2, serve_forever, start_server
from scalerl.settings import Settings
from scalerl.v1 import generator_pb2_grpc
from scalerl_generator.jobs import Generator, work_loop
from scalerl_generator.service import ENGINE_HEALTH_NAME, GeneratorServicer, track_engine_readiness


def main(settings: Settings) -> None:
    import torch

    torch.set_num_threads(settings.torch_threads)
    generator_id = settings.generator_id or f"{settings.generator_role}-{socket.gethostname()}-{os.getpid()}"
    generator = Generator(generator_id, settings.generator_role)
    servicer = GeneratorServicer(generator)
    registration = ServiceRegistration(["scalerl.v1.Generator"],
                                       lambda s: generator_pb2_grpc.add_GeneratorServicer_to_server(servicer, s))
    grpc_port, metrics_port = settings.ports()
    # run_service's steps, with the server in hand: readiness needs its health servicer.
    running = start_server(registration, host=settings.host, grpc_port=grpc_port, metrics_port=metrics_port)
    track_engine_readiness(running)
    worker = threading.Thread(target=work_loop, args=(settings, generator, running.stop_event),
                              name="generator-work", daemon=True)
    worker.start()

    def shutdown() -> None:
        running.health.set(ENGINE_HEALTH_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
        worker.join(settings.drain_timeout_s)

    serve_forever(running, drain_timeout_s=settings.drain_timeout_s, on_shutdown=shutdown)
