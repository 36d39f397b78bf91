"""Generator process (role rollout or evaluator): settings -> replica + servicer -> the shared gRPC bootstrap,
with the job loop (`jobs.work_loop`) as background work."""

from __future__ import annotations

import os
import socket

from scalerl.serving import ServiceRegistration, run_service
from scalerl.settings import Settings
from scalerl.v1 import generator_pb2_grpc
from scalerl_generator.jobs import Generator, work_loop
from scalerl_generator.service import GeneratorServicer


def main(settings: Settings) -> None:
    import torch

    torch.set_num_threads(settings.torch_threads)
    generator_id = settings.generator_id or f"{settings.generator_role}-{socket.gethostname()}-{os.getpid()}"
    generator = Generator(generator_id, settings.generator_role)
    servicer = GeneratorServicer(generator)
    registration = ServiceRegistration(["scalerl.v1.Generator"],
                                       lambda s: generator_pb2_grpc.add_GeneratorServicer_to_server(servicer, s))
    run_service(settings, registration, background=lambda stop: work_loop(settings, generator, stop))
